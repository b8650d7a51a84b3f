package rules

import (
	"sync"
	"sync/atomic"
)

// Holder serves the current Snapshot to every request and swaps it atomically: a reader
// sees the old snapshot or the new one, never a mix. Current is one atomic load (no lock,
// no allocation). Safe for concurrent use. The zero value is not usable: call NewHolder.
type Holder struct {
	mu   sync.Mutex // mu guards subs and serialises Store's notifications
	subs map[chan *Snapshot]struct{}
	cur  atomic.Pointer[Snapshot]
}

// NewHolder returns a Holder serving initial; nil means an empty snapshot that matches
// nothing (Version "", Len 0).
func NewHolder(initial *Snapshot) *Holder {
	h := &Holder{}
	if initial == nil {
		initial = &Snapshot{}
	}
	h.cur.Store(initial)
	return h
}

// Current returns the snapshot in force. Never nil.
func (h *Holder) Current() *Snapshot { return h.cur.Load() }

// Store makes s the snapshot in force (nil is ignored) and tells subscribers.
func (h *Holder) Store(s *Snapshot) {
	if s == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cur.Store(s)
	for c := range h.subs {
		// Each channel holds at most the newest snapshot: replace an unread older one.
		select {
		case <-c:
		default:
		}
		c <- s // cannot block: capacity 1, emptied above, and only Store sends (under mu)
	}
}

// Subscribe returns a channel that receives each snapshot stored after the call (a slow
// reader sees only the newest) and a cancel func that stops delivery. The channel is never
// closed; cancel is idempotent.
func (h *Holder) Subscribe() (<-chan *Snapshot, func()) {
	c := make(chan *Snapshot, 1)
	h.mu.Lock()
	if h.subs == nil {
		h.subs = map[chan *Snapshot]struct{}{}
	}
	h.subs[c] = struct{}{}
	h.mu.Unlock()
	return c, func() {
		h.mu.Lock()
		delete(h.subs, c)
		h.mu.Unlock()
	}
}
