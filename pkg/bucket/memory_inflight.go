package bucket

import (
	"context"
	"hash/maphash"
	"sync"
)

// heldShard is one shard of a Memory store's in-flight slots.
type heldShard struct {
	mu   sync.Mutex // mu guards sets
	sets map[heldKey]*heldSet
}

// heldKey names one (identity, limit)'s slots; a struct of two strings, so a lookup
// builds no key.
type heldKey struct{ identity, name string }

// heldSet is one (identity, limit)'s slots, oldest first, at most MaxConcurrent.
type heldSet struct {
	slots []heldSlot
	until int64 // Unix ms when the newest slot times out: the set may be forgotten after
}

type heldSlot struct {
	handle string
	at     int64 // Unix ms it was admitted
}

// expire drops the slots admitted at or before now − timeout (ms), as the Redis script's
// ZREMRANGEBYSCORE does.
func (s *heldSet) expire(now, timeout int64) {
	cut := 0
	for cut < len(s.slots) && s.slots[cut].at <= now-timeout {
		cut++
	}
	if cut > 0 {
		clear(s.slots[:cut])
		s.slots = append(s.slots[:0], s.slots[cut:]...)
	}
}

func (s *heldSet) find(handle string) int {
	for i := range s.slots {
		if s.slots[i].handle == handle {
			return i
		}
	}
	return -1
}

func (s *heldSet) remove(i int) {
	copy(s.slots[i:], s.slots[i+1:])
	s.slots[len(s.slots)-1] = heldSlot{}
	s.slots = s.slots[:len(s.slots)-1]
}

func (m *Memory) heldShardOf(h *Hold) (*heldShard, heldKey) {
	return &m.held[maphash.String(m.seed, h.Identity)%memoryShards], heldKey{h.Identity, h.Name}
}

// Acquire implements InflightStore.
func (m *Memory) Acquire(_ context.Context, h *Hold) (HoldResult, error) {
	if err := h.Validate(); err != nil {
		return HoldResult{}, err
	}
	return m.AcquireAt(h, m.clock.Now().UnixMilli()), nil
}

// AcquireAt is Acquire at the given time (Unix ms) for a validated hold.
func (m *Memory) AcquireAt(h *Hold, now int64) HoldResult {
	sh, key := m.heldShardOf(h)
	timeout := h.Timeout.Milliseconds()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s := sh.sets[key]
	if s != nil {
		s.expire(now, timeout)
		if s.find(h.Handle) >= 0 {
			return HoldResult{Held: true, InFlight: int64(len(s.slots)), Source: SourceMemory}
		}
	}
	n := 0
	if s != nil {
		n = len(s.slots)
	}
	if int64(n) >= h.Cap {
		res := HoldResult{InFlight: int64(n), Source: SourceMemory, RetryAfter: h.Timeout}
		if n > 0 {
			res.RetryAfter = holdRetry(s.slots[0].at, now, h.Timeout)
		}
		return res
	}
	if s == nil {
		sh.makeRoom(m.max, now)
		s = &heldSet{}
		sh.sets[key] = s
	}
	// Slots stay in time order: a clock that stepped back files the new slot as the newest
	// admitted (Redis orders by score instead; the difference lasts one step back).
	s.slots = append(s.slots, heldSlot{handle: h.Handle, at: now})
	s.until = max(s.until, now+timeout)
	return HoldResult{Held: true, InFlight: int64(len(s.slots)), Source: SourceMemory}
}

// Release implements InflightStore.
func (m *Memory) Release(_ context.Context, h *Hold) error {
	if err := h.ValidateRelease(true); err != nil {
		return err
	}
	return m.releaseAt(h, m.clock.Now().UnixMilli(), false)
}

// ReleaseOldest implements InflightStore.
func (m *Memory) ReleaseOldest(_ context.Context, h *Hold) error {
	if err := h.ValidateRelease(false); err != nil {
		return err
	}
	return m.releaseAt(h, m.clock.Now().UnixMilli(), true)
}

func (m *Memory) releaseAt(h *Hold, now int64, oldest bool) error {
	sh, key := m.heldShardOf(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	s := sh.sets[key]
	if s == nil {
		return ErrUnknownHandle
	}
	if h.Timeout > 0 {
		s.expire(now, h.Timeout.Milliseconds())
	}
	i := 0
	if !oldest {
		i = s.find(h.Handle)
	}
	if i < 0 || len(s.slots) == 0 {
		return ErrUnknownHandle
	}
	s.remove(i) // an empty set stays until makeRoom needs its room: reused without allocating
	return nil
}

// Held returns how many slots the store keeps for (identity, name), expired ones not yet
// forgotten included (for tests).
func (m *Memory) Held(identity, name string) int {
	sh, key := m.heldShardOf(&Hold{Identity: identity, Name: name})
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if s := sh.sets[key]; s != nil {
		return len(s.slots)
	}
	return 0
}

// makeRoom keeps the shard under max sets like memShard.makeRoom: sets empty or whose
// every slot timed out go first; else the one that times out soonest among a few is forgotten, which
// errs over (its slots come back early) and happens only when more than MaxKeys
// (identity, limit) pairs hold slots at once. Called with sh.mu held.
func (sh *heldShard) makeRoom(max int, now int64) {
	if len(sh.sets) < max {
		return
	}
	var victim heldKey
	var best int64
	n, freed, found := 0, false, false
	for k, s := range sh.sets {
		if s.until <= now || len(s.slots) == 0 {
			delete(sh.sets, k)
			freed = true
		} else if !found || s.until < best {
			victim, best, found = k, s.until, true
		}
		if n++; n == 32 {
			break
		}
	}
	if !freed && found {
		delete(sh.sets, victim)
	}
}

// HeldKeys returns how many (identity, limit) slot sets the store keeps, empty ones not
// yet forgotten included: at most about MaxKeys whatever identities clients invent.
func (m *Memory) HeldKeys() int {
	n := 0
	for i := range m.held {
		sh := &m.held[i]
		sh.mu.Lock()
		n += len(sh.sets)
		sh.mu.Unlock()
	}
	return n
}
