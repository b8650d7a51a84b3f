package lease

import (
	"hash/maphash"
	"sync"

	"github.com/allot-dev/allot/pkg/bucket"
)

// The table: a fixed number of shards, each a map plus an intrusive LRU ring under one
// mutex. A lookup touches one shard; an insert into a full shard evicts that shard's least
// recently used entry, so the size bound holds with O(1) work per insert and no scans.
//
// A hit moves its entry to the front only if a quarter of the shard's capacity has gone
// to the front since it last did (the shard's tick counts those moves and inserts): a busy
// key's hits then leave the ring, and the neighbours' cache lines, alone. The order errs by
// at most that quarter: an entry is evicted only once three quarters of a shard's capacity
// of other keys were used or inserted after its last use, rather than all of it.

// shardsFor picks a power-of-two shard count: up to 64, and at least 16 keys a shard, so
// that maxKeys/shards (rounded down) keeps the total under maxKeys without wasting much.
func shardsFor(maxKeys int) int {
	n := 64
	for n > 1 && maxKeys/n < 16 {
		n /= 2
	}
	return n
}

type shard struct {
	mu   sync.Mutex // mu guards m, the ring, tick and every field of the entries in m
	m    map[string]*entry
	ring entry  // sentinel: ring.next is the most recently used, ring.prev the least
	tick uint64 // entries sent to the front so far
	// limits holds the last few limit sets the shard's entries were given, for setLimits
	// to share: the entries of one rule then point at one slice (never written in place)
	// instead of ten thousand copies, which the collector would mark one by one.
	limits [4][]bucket.Limit
	next   int // the slot in limits the next new set goes to
	// spare is a foreground call's flight that landed with no check waiting on it, for the
	// shard's next call to reuse: a quiet key's every check is a call, and allocated one.
	spare *flight
	_     [64]byte
}

// internLimits returns a slice equal to ls that no one writes: one the shard already
// holds, or a copy that it now holds. Called with sh.mu held.
func (sh *shard) internLimits(ls []bucket.Limit) []bucket.Limit {
	for _, l := range sh.limits {
		if l != nil && sameLimits(l, ls) {
			return l
		}
	}
	c := append([]bucket.Limit(nil), ls...)
	sh.limits[sh.next] = c
	sh.next = (sh.next + 1) % len(sh.limits)
	return c
}

func (sh *shard) init() {
	sh.m = make(map[string]*entry)
	sh.ring.next, sh.ring.prev = &sh.ring, &sh.ring
}

func (s *Store) shardOf(key string) *shard {
	return &s.shards[maphash.String(s.seed, key)&s.mask]
}

// lookup returns key's entry, inserting it (and evicting the least recently used entry if
// the shard is full) if absent, and marks it most recently used. Called with sh.mu held.
func (s *Store) lookup(sh *shard, key string, now int64) *entry {
	if e := sh.m[key]; e != nil {
		if sh.tick-e.tick >= s.moveAfter {
			e.prev.next, e.next.prev = e.next, e.prev
			sh.pushFront(e)
		}
		return e
	}
	if len(sh.m) >= s.perShard {
		v := sh.ring.prev
		v.prev.next, v.next.prev = v.next, v.prev
		v.prev, v.next = nil, nil
		delete(sh.m, v.key)
		v.gone = true
		s.emit(EventEvicted, v.held())
	}
	e := &entry{key: key, winStart: now}
	sh.m[key] = e
	sh.pushFront(e)
	return e
}

func (sh *shard) pushFront(e *entry) {
	sh.tick++
	e.tick = sh.tick
	e.prev, e.next = &sh.ring, sh.ring.next
	sh.ring.next.prev = e
	sh.ring.next = e
}

// Len returns the number of keys in the table (at most Config.MaxKeys).
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Cap returns the table's hard bound: shards × keys per shard, which is <= Config.MaxKeys.
func (s *Store) Cap() int { return len(s.shards) * s.perShard }
