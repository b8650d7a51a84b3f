package bucket

import (
	"context"
	"hash/maphash"
	"sync"

	"github.com/allot-dev/allot/pkg/clock"
)

// DefaultMemoryMaxKeys bounds a Memory store that was given no bound.
const DefaultMemoryMaxKeys = 1 << 20

const memoryShards = 64

// Memory is an exact in-process Store: the single-process default and the reference the
// Redis store is checked against. Safe for concurrent use.
//
// It forgets a bucket once it would be full again (no answer changes). It holds at most
// MaxKeys identities: when full it first drops identities whose buckets are all full, and
// only then evicts the identity nearest to full among a few it looks at. Such an eviction
// errs over — that identity's buckets start full again — by at most the tokens it was
// missing, and happens only when more than MaxKeys identities are active at once.
type Memory struct {
	clock  clock.Clock
	seed   maphash.Seed
	max    int // per shard
	shards [memoryShards]memShard
}

type memShard struct {
	mu      sync.Mutex // mu guards entries
	entries map[string]*memEntry
}

type memEntry struct {
	fullAt int64 // Unix µs when every bucket is full again
	names  []string
	states []State
}

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

// TakeAt is Take at the given time (Unix µs) for an already validated request.
func (m *Memory) TakeAt(req *Request, now int64) Result {
	var buf [MaxLimits]float64
	tokens := buf[:len(req.Limits)]
	s := &m.shards[maphash.String(m.seed, req.Identity)%memoryShards]

	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[req.Identity]
	for i, l := range req.Limits {
		var st State
		if e != nil && now < e.fullAt {
			st = e.find(l.Name)
		}
		tokens[i] = l.TokensAt(st, now)
	}
	d := Decide(req.Limits, tokens, req.Want, req.MinGrant())
	if d.Granted == 0 {
		return ResultOf(d, SourceMemory)
	}
	if e == nil {
		s.makeRoom(m.max, now)
		e = &memEntry{}
		s.entries[req.Identity] = e
	}
	e.store(req.Limits, tokens, now)
	return ResultOf(d, SourceMemory)
}

func (e *memEntry) find(name string) State {
	for i, n := range e.names {
		if n == name {
			return e.states[i]
		}
	}
	return State{}
}

// store replaces the entry's buckets with the request's: buckets of other names are full
// by the time they matter again or belong to an older rule set.
func (e *memEntry) store(limits []Limit, tokens []float64, now int64) {
	if cap(e.names) < len(limits) {
		e.names = make([]string, len(limits))
		e.states = make([]State, len(limits))
	}
	e.names, e.states = e.names[:len(limits)], e.states[:len(limits)]
	e.fullAt = now
	for i, l := range limits {
		e.names[i] = l.Name
		e.states[i] = State{Tokens: tokens[i], Last: now}
		if f := now + l.FullAfterMicros(tokens[i]); f > e.fullAt {
			e.fullAt = f
		}
	}
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
		if e.fullAt <= now { // full again: forgetting it changes no answer
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
