package lease

import (
	"context"
	"errors"

	"github.com/allot-dev/allot/pkg/bucket"
)

// In-flight slots are not leased: a slot is held by one request, so there is nothing to
// batch. The Store passes them to the next store (bucket.InflightStore), so a stack
// fallback → lease → redis holds them in Redis.

var errNoInflight = errors.New("lease: the next store holds no in-flight slots")

// Acquire implements bucket.InflightStore by the next store's.
func (s *Store) Acquire(ctx context.Context, h *bucket.Hold) (bucket.HoldResult, error) {
	if n, ok := s.next.(bucket.InflightStore); ok {
		return n.Acquire(ctx, h)
	}
	return bucket.HoldResult{}, errNoInflight
}

// Release implements bucket.InflightStore by the next store's.
func (s *Store) Release(ctx context.Context, h *bucket.Hold) error {
	if n, ok := s.next.(bucket.InflightStore); ok {
		return n.Release(ctx, h)
	}
	return errNoInflight
}

// ReleaseOldest implements bucket.InflightStore by the next store's.
func (s *Store) ReleaseOldest(ctx context.Context, h *bucket.Hold) error {
	if n, ok := s.next.(bucket.InflightStore); ok {
		return n.ReleaseOldest(ctx, h)
	}
	return errNoInflight
}
