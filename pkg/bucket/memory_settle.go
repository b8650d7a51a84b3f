package bucket

import (
	"context"
	"hash/maphash"
	"sync"
)

// Settlements in a Memory store (Settler): the same math as the Redis script, and markers
// in a table of their own, at most MaxKeys of them (per shard, MaxKeys/64): when full,
// expired markers go first, else the one that expires soonest — its settlement is then
// refused and its estimate stands (errs as a lost settlement: under for a check that cost
// more than its estimate, over for one that cost less).

// markShard is one shard of a Memory store's settlement markers.
type markShard struct {
	mu    sync.Mutex // mu guards marks
	marks map[markKey]memMark
}

type markKey struct{ identity, id string }

type memMark struct {
	estimate, cost int64
	until          int64 // Unix µs when the marker expires
}

func (m *Memory) markShardOf(identity string) *markShard {
	return &m.marks[maphash.String(m.seed, identity)%memoryShards]
}

// Mark implements Settler.
func (m *Memory) Mark(_ context.Context, mk *Mark) error {
	if err := mk.Validate(); err != nil {
		return err
	}
	m.MarkAt(mk, m.clock.Now().UnixMicro())
	return nil
}

// MarkAt is Mark at the given time (Unix µs) of a validated mark.
func (m *Memory) MarkAt(mk *Mark, now int64) {
	s := m.markShardOf(mk.Identity)
	s.mu.Lock()
	defer s.mu.Unlock()
	k := markKey{mk.Identity, mk.ID}
	if old, ok := s.marks[k]; ok && old.until > now {
		return // NX: the marker there is kept
	}
	if len(s.marks) >= m.max {
		var victim markKey
		best, n := int64(0), 0
		for k, v := range s.marks {
			if v.until <= now {
				delete(s.marks, k)
				continue
			}
			if n == 0 || v.until < best {
				victim, best = k, v.until
			}
			if n++; n == 32 {
				break
			}
		}
		if len(s.marks) >= m.max {
			delete(s.marks, victim)
		}
	}
	s.marks[k] = memMark{estimate: mk.Estimate, cost: mk.Cost, until: now + max(mk.TTL.Microseconds(), 1)}
}

// Settle implements Settler.
func (m *Memory) Settle(_ context.Context, st *Settlement) (Settled, error) {
	if err := st.Validate(); err != nil {
		return Settled{}, err
	}
	return m.SettleAt(st, m.clock.Now().UnixMicro())
}

// SettleAt is Settle at the given time (Unix µs) of a validated settlement.
func (m *Memory) SettleAt(st *Settlement, now int64) (Settled, error) {
	delta := st.Delta
	if st.ID != "" {
		ms := m.markShardOf(st.Identity)
		ms.mu.Lock()
		k := markKey{st.Identity, st.ID}
		mk, ok := ms.marks[k]
		delete(ms.marks, k)
		ms.mu.Unlock()
		if !ok || mk.until <= now {
			return Settled{}, ErrNotMarked
		}
		// As the script computes it: in float64, bounded by maxDelta.
		delta = int64(min(max(float64(st.Actual)*float64(mk.cost)-float64(mk.estimate), -maxDelta), maxDelta))
	}
	var buf [MaxLimits]float64
	tokens := buf[:len(st.Limits)]
	s := &m.shards[maphash.String(m.seed, st.Identity)%memoryShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[st.Identity]
	for i, l := range st.Limits {
		var bs State
		if e != nil && now < e.fullAt {
			bs = e.find(l.Name, now)
		}
		tokens[i] = l.TokensAt(bs, now)
		if delta != 0 {
			tokens[i] = l.Settle(tokens[i], delta)
		}
	}
	if delta != 0 {
		if e == nil {
			s.makeRoom(m.max, now)
			e = &memEntry{}
			s.entries[st.Identity] = e
		}
		e.store(st.Limits, tokens, now)
	}
	lim := 0
	for i := range tokens {
		if tokens[i] < tokens[lim] {
			lim = i
		}
	}
	return Settled{Delta: delta, Limiting: lim, Remaining: settleRemaining(tokens[lim]), Source: SourceMemory}, nil
}
