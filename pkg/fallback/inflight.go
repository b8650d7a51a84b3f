package fallback

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/allot-dev/allot/pkg/bucket"
)

// In-flight slots (bucket.InflightStore) through the Store.
//
// While a key's shard breaker is closed, an acquire calls the next store with
// ReplyTimeout as its deadline; when the breaker is open, or the call fails, the slot is
// held in the Store's own table at a local cap of max(1, floor(cap × Slack / N)) (N as
// for local limits: the live enforcers, or fewer that serve the key), and a fail-closed
// hold is refused (bucket.ErrUnavailable). The breakers are moved by rate takes only: an
// in-flight call that fails is answered locally without counting against its shard.
//
// Which way it errs: during an outage the N enforcers together hold up to Slack × cap
// slots of one key (over; plus up to one slot an enforcer when cap × Slack / N < 1), and
// the slots held in Redis when the outage began are forgotten by the local counts (over,
// by those, until they time out). A slot acquired locally is released locally, one
// acquired in Redis in Redis: a release tries the store the breaker points at first,
// then the other. A release that finds the breaker open and the slot not local cannot
// reach it: bucket.ErrUnavailable, and the slot comes back at its timeout (under).

// Acquire implements bucket.InflightStore.
func (s *Store) Acquire(ctx context.Context, h *bucket.Hold) (bucket.HoldResult, error) {
	if s.closed.Load() {
		return bucket.HoldResult{}, ErrClosed
	}
	if err := h.Validate(); err != nil {
		return bucket.HoldResult{}, err
	}
	b := s.breakerFor(h.Identity)
	if stateOf(b.word.Load()) == Closed && s.held != nil {
		cctx, cancel := context.WithTimeout(ctx, s.cfg.ReplyTimeout)
		res, err := s.held.Acquire(cctx, h)
		cancel()
		if err == nil {
			s.obs.Decision(b.shard, res.Source, res.Held)
			return res, nil
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return bucket.HoldResult{}, ctxErr
		}
		return s.holdLocally(b, h, LocalError)
	}
	return s.holdLocally(b, h, LocalOpen)
}

// holdLocally answers an acquire from the Store's own table at the local cap, or refuses
// a fail-closed one with bucket.ErrUnavailable.
func (s *Store) holdLocally(b *breaker, h *bucket.Hold, why LocalReason) (bucket.HoldResult, error) {
	now := s.clock.Now()
	s.obs.Local(b.shard, why)
	if h.FailClosed {
		s.obs.Decision(b.shard, bucket.SourceFailClosed, false)
		return bucket.HoldResult{Source: bucket.SourceFailClosed, RetryAfter: s.retryAfter(b, now)}, bucket.ErrUnavailable
	}
	local := *h
	local.Cap = localCap(h.Cap, s.cfg.Slack/float64(s.peersFor(h.Identity)))
	res := s.local.AcquireAt(&local, now.UnixMilli())
	res.Source = bucket.SourceFallback
	s.obs.Decision(b.shard, bucket.SourceFallback, res.Held)
	return res, nil
}

// localCap is an enforcer's cap during an outage: floor(cap × f), at least 1 when cap is,
// so a key is never refused everywhere by rounding.
func localCap(cap int64, f float64) int64 {
	if cap <= 0 {
		return 0
	}
	return min(max(int64(math.Floor(float64(cap)*f+1e-9)), 1), bucket.MaxConcurrent)
}

// peersFor is N of the local limits: the live enforcers, or those that serve identity
// when Config.Seen knows fewer.
func (s *Store) peersFor(identity string) int {
	n := 1
	if s.cfg.Peers != nil {
		if p := s.cfg.Peers(); p > 1 {
			n = p
		}
	}
	if s.cfg.Seen != nil {
		if k := s.cfg.Seen(identity); k > 0 && k < n {
			n = k
		}
	}
	return n
}

// Release implements bucket.InflightStore.
func (s *Store) Release(ctx context.Context, h *bucket.Hold) error {
	if err := h.ValidateRelease(true); err != nil {
		return err
	}
	return s.release(ctx, h, false)
}

// ReleaseOldest implements bucket.InflightStore.
func (s *Store) ReleaseOldest(ctx context.Context, h *bucket.Hold) error {
	if err := h.ValidateRelease(false); err != nil {
		return err
	}
	return s.release(ctx, h, true)
}

func (s *Store) release(ctx context.Context, h *bucket.Hold, oldest bool) error {
	if s.closed.Load() {
		return ErrClosed
	}
	local := func() error {
		if oldest {
			return s.local.ReleaseOldest(ctx, h)
		}
		return s.local.Release(ctx, h)
	}
	b := s.breakerFor(h.Identity)
	if stateOf(b.word.Load()) != Closed || s.held == nil {
		if err := local(); !errors.Is(err, bucket.ErrUnknownHandle) || s.held == nil {
			return err
		}
		// Not held here: it may be held in Redis, which the open breaker keeps us from.
		return fmt.Errorf("%w: in-flight slot not held locally and its shard is not reachable; it comes back at its timeout", bucket.ErrUnavailable)
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.ReplyTimeout)
	var err error
	if oldest {
		err = s.held.ReleaseOldest(cctx, h)
	} else {
		err = s.held.Release(cctx, h)
	}
	cancel()
	if err == nil {
		return nil
	}
	if lerr := local(); lerr == nil {
		return nil // acquired locally during an outage
	}
	return err
}
