package bucket

import (
	"cmp"
	"context"
	"hash/maphash"
	"slices"
	"sync"
	"time"

	"github.com/allot-dev/allot/pkg/clock"
)

// DefaultMemoryMaxKeys bounds a Memory store that was given no bound.
const DefaultMemoryMaxKeys = 1 << 20

const memoryShards = 64

// Memory is an exact in-process Store: the single-process default and the reference the
// Redis store is checked against. Safe for concurrent use.
//
// It forgets a bucket once it would be full again (no answer changes). Requests of one
// identity may carry different limits (one rule per endpoint, say): each named bucket is
// kept, up to 2×MaxLimits names per identity. It holds at most
// MaxKeys identities: when full it first drops identities whose buckets are all full, and
// only then evicts the identity nearest to full among a few it looks at. Such an eviction
// errs over — that identity's buckets start full again — by at most the tokens it was
// missing, and happens only when more than MaxKeys identities are active at once.
//
// It is also an InflightStore (memory_inflight.go): at most MaxKeys (identity, limit) slot
// sets, each at most its cap, bounded the same way (empty or timed-out sets go first,
// else the one that times out soonest: its slots come back early, erring over).
//
// And it is a Settler (memory_settle.go): the Redis script's settlement math, with its
// markers in a table bounded the same way.
type Memory struct {
	clock  clock.Clock
	seed   maphash.Seed
	max    int // per shard
	shards [memoryShards]memShard
	held   [memoryShards]heldShard // in-flight slots (memory_inflight.go)
	marks  [memoryShards]markShard // settlement markers (memory_settle.go)
	fences struct {                // fenced enforcers' marks (fence.go)
		mu    sync.Mutex
		at    map[string]int64  // id → Unix ms of its last mark
		seq   map[string]uint64 // id → the seq of its last mark
		heard map[string]int64  // id → Unix ms the balancer last accepted a report of it
	}
}

type memShard struct {
	mu      sync.Mutex // mu guards entries
	entries map[string]*memEntry
}

type memEntry struct {
	fullAt     int64 // Unix µs when every bucket is full again
	sightUntil int64 // Unix µs when no sighting counts any more: the entry may be forgotten after both
	buckets    []memBucket
	sights     []memSight   // Request.Sight: the takers sighted, at most MaxSightings
	penUntil   int64        // Unix µs when no penalty state matters any more
	pens       []memPenalty // Request.Penalty: the identity's penalty states, at most memMaxBuckets
}

// memPenalty is one penalty's state for an identity.
type memPenalty struct {
	name string
	st   PenaltyState
}

// penalty returns the state of p at now: the zero state if none, or once it has expired
// (Penalty.ExpiresAt), as Redis expires it.
func (e *memEntry) penalty(p *Penalty, now int64) PenaltyState {
	for _, x := range e.pens {
		if x.name == p.Name && now < p.ExpiresAt(x.st) {
			return x.st
		}
	}
	return PenaltyState{}
}

// setPenalty stores st for p, replacing a state that no longer matters (or, past
// memMaxBuckets names, the one that expires first: forgetting it errs under, toward no
// penalty).
func (e *memEntry) setPenalty(p *Penalty, st PenaltyState) {
	exp := p.ExpiresAt(st)
	e.penUntil = max(e.penUntil, exp)
	reuse := -1
	for i := range e.pens {
		if e.pens[i].name == p.Name {
			e.pens[i].st = st
			return
		}
		if reuse < 0 || e.pens[i].st.Until < e.pens[reuse].st.Until {
			reuse = i
		}
	}
	if len(e.pens) < memMaxBuckets {
		e.pens = append(e.pens, memPenalty{name: p.Name, st: st})
		return
	}
	e.pens[reuse] = memPenalty{name: p.Name, st: st}
}

// memSight is one taker's last sighting of an identity (Unix µs).
type memSight struct {
	who string
	at  int64
}

// sight records who's sighting at now and returns the distinct takers sighted within ttl
// µs, as the Redis script does: the oldest dropped past MaxSightings.
func (e *memEntry) sight(who string, now, ttl int64) int {
	kept := e.sights[:0]
	found := false
	for _, x := range e.sights {
		if x.who == who {
			x.at, found = now, true
		}
		if x.at >= now-ttl {
			kept = append(kept, x)
		}
	}
	if !found {
		kept = append(kept, memSight{who: who, at: now})
	}
	if len(kept) > MaxSightings {
		slices.SortFunc(kept, func(a, b memSight) int { return cmp.Compare(a.at, b.at) })
		kept = kept[len(kept)-MaxSightings:]
	}
	if len(kept) < len(e.sights) {
		clear(e.sights[len(kept):]) // drop the strings of those that went
	}
	e.sights = kept
	e.sightUntil = max(e.sightUntil, now+ttl)
	return len(kept)
}

// memBucket is one named bucket of an identity. Buckets of names a request does not carry
// are kept (another rule may take from them next), up to memMaxBuckets per identity.
type memBucket struct {
	name   string
	st     State
	fullAt int64 // Unix µs when this bucket is full again: its state no longer matters
}

// memMaxBuckets bounds the names remembered per identity.
const memMaxBuckets = 2 * MaxLimits

// NewMemory returns a Memory store reading time from c, holding at most maxKeys identities
// (DefaultMemoryMaxKeys if maxKeys <= 0).
func NewMemory(c clock.Clock, maxKeys int) *Memory {
	if maxKeys <= 0 {
		maxKeys = DefaultMemoryMaxKeys
	}
	per := (maxKeys + memoryShards - 1) / memoryShards
	m := &Memory{clock: c, seed: maphash.MakeSeed(), max: per}
	for i := range m.shards {
		m.shards[i].entries = make(map[string]*memEntry)
		m.held[i].sets = make(map[heldKey]*heldSet)
		m.marks[i].marks = make(map[markKey]memMark)
	}
	return m
}

// Len returns how many identities the store remembers.
func (m *Memory) Len() int {
	n := 0
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		n += len(s.entries)
		s.mu.Unlock()
	}
	return n
}

// Take implements Store.
func (m *Memory) Take(ctx context.Context, req *Request) (Result, error) {
	if err := req.Validate(); err != nil {
		return Result{}, err
	}
	return m.TakeAt(req, m.clock.Now().UnixMicro()), nil
}

// TakeValid is Take of a request the caller has validated (ValidTaker).
func (m *Memory) TakeValid(_ context.Context, req *Request) (Result, error) {
	return m.TakeAt(req, m.clock.Now().UnixMicro()), nil
}

// TakeAt is Take at the given time (Unix µs) for an already validated request.
func (m *Memory) TakeAt(req *Request, now int64) Result {
	var buf [MaxLimits]float64
	tokens := buf[:len(req.Limits)]
	s := &m.shards[maphash.String(m.seed, req.Identity)%memoryShards]

	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[req.Identity]
	seen := 0
	if req.Sight != "" {
		if e == nil {
			s.makeRoom(m.max, now)
			e = &memEntry{}
			s.entries[req.Identity] = e
		}
		seen = e.sight(req.Sight, now, max(req.SightTTL.Microseconds(), 1))
	}
	var pen PenaltyState
	if p := req.Penalty; p != nil {
		// Penalty: blocked, or blocked by the refusals handed over (the take script's
		// steps, in the same order).
		if e != nil {
			pen = e.penalty(p, now)
		}
		if !pen.Blocked(now) && req.Refused > 0 {
			pen = p.Add(pen, now, req.Refused)
			e = s.entryFor(e, req.Identity, m.max, now)
			e.setPenalty(p, pen)
		}
		if pen.Blocked(now) {
			return penalized(pen, now, seen, SourceMemory)
		}
	}
	for i, l := range req.Limits {
		var st State
		if e != nil && now < e.fullAt {
			st = e.find(l.Name, now)
		}
		tokens[i] = l.TokensAt(st, now)
	}
	d := Decide(req.Limits, tokens, req.Want, req.MinGrant())
	if d.Granted == 0 {
		if p := req.Penalty; p != nil {
			pen = p.Add(pen, now, 1)
			e = s.entryFor(e, req.Identity, m.max, now)
			e.setPenalty(p, pen)
			if pen.Blocked(now) {
				return penalized(pen, now, seen, SourceMemory)
			}
		}
		res := ResultOf(d, SourceMemory)
		res.Seen, res.PenaltyCount = seen, pen.Count
		return res
	}
	if e == nil {
		s.makeRoom(m.max, now)
		e = &memEntry{}
		s.entries[req.Identity] = e
	}
	e.store(req.Limits, tokens, now)
	res := ResultOf(d, SourceMemory)
	res.Seen, res.PenaltyCount = seen, pen.Count
	return res
}

// entryFor returns e, or a new entry for identity when e is nil. Called with s.mu held.
func (s *memShard) entryFor(e *memEntry, identity string, max int, now int64) *memEntry {
	if e != nil {
		return e
	}
	s.makeRoom(max, now)
	e = &memEntry{}
	s.entries[identity] = e
	return e
}

// penalized is the answer for an identity blocked by its penalty at now.
func penalized(st PenaltyState, now int64, seen int, src Source) Result {
	d := time.Duration(st.Until-now) * time.Microsecond
	return Result{RetryAfter: d, Reset: d, Source: src, Seen: seen, Penalized: true, PenaltyCount: st.Count}
}

func (e *memEntry) find(name string, now int64) State {
	for i := range e.buckets {
		if b := &e.buckets[i]; b.name == name {
			if b.fullAt <= now {
				return State{}
			}
			return b.st
		}
	}
	return State{}
}

// store writes what Decide left in tokens. A bucket's time never moves back: if the clock
// stepped back, TokensAt refilled nothing and the bucket keeps its later time, so the
// interval is not refilled twice. The Redis script does the same.
func (e *memEntry) store(limits []Limit, tokens []float64, now int64) {
	for i, l := range limits {
		b := e.slot(l.Name, limits[:i], now)
		last := now
		if b.name == l.Name && b.fullAt > now && b.st.Last > now {
			last = b.st.Last
		}
		b.name = l.Name
		b.st = State{Tokens: tokens[i], Last: last}
		b.fullAt = last + l.FullAfterMicros(tokens[i])
	}
	e.fullAt = now
	for i := range e.buckets {
		if f := e.buckets[i].fullAt; f > e.fullAt {
			e.fullAt = f
		}
	}
}

// slot returns the bucket for name: its own, else one that is full again (forgetting it
// changes no answer), else a new one, else the one nearest to full — which errs over for
// that bucket, and only when one identity is taken from under more than memMaxBuckets
// names within one refill time. It never hands out a bucket of a name in written.
func (e *memEntry) slot(name string, written []Limit, now int64) *memBucket {
	reuse := -1
outer:
	for i := range e.buckets {
		b := &e.buckets[i]
		if b.name == name {
			return b
		}
		for _, w := range written {
			if w.Name == b.name {
				continue outer
			}
		}
		if reuse < 0 || b.fullAt < e.buckets[reuse].fullAt {
			reuse = i
		}
	}
	if reuse >= 0 && (e.buckets[reuse].fullAt <= now || len(e.buckets) >= memMaxBuckets) {
		e.buckets[reuse] = memBucket{}
		return &e.buckets[reuse]
	}
	e.buckets = append(e.buckets, memBucket{})
	return &e.buckets[len(e.buckets)-1]
}

// makeRoom keeps the shard under max entries, looking at a bounded sample so a client
// inventing keys costs O(1) per insert. Called with s.mu held. Map iteration starts at a
// random place, so successive calls sample different entries.
func (s *memShard) makeRoom(max int, now int64) {
	if len(s.entries) < max {
		return
	}
	var victim string
	var best int64
	n, freed := 0, false
	for k, e := range s.entries {
		if e.fullAt <= now && e.sightUntil <= now && e.penUntil <= now { // full again, no sighting or penalty counts: forgetting it changes no answer
			delete(s.entries, k)
			freed = true
		} else if n == 0 || e.fullAt < best {
			victim, best = k, e.fullAt
		}
		if n++; n == 32 {
			break
		}
	}
	if !freed && victim != "" {
		delete(s.entries, victim)
	}
}
