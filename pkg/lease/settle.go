package lease

import (
	"context"
	"errors"

	"github.com/allot-dev/allot/pkg/bucket"
)

// Settlements (bucket.Settler) are not leased: a settlement adjusts the buckets in the
// next store, where the leased tokens came from, so a stack fallback → lease → redis
// settles in Redis. The tokens this layer holds leased are not touched: a key in debt in
// Redis is refused by the next lease call, while the enforcers spend what they hold
// (over, by at most the tokens leased when the debt arose: about 1.5 batches an
// enforcer, § "Which way it errs" in doc.go); a refund does not lift a refusal cached
// from Redis before it (under, until that retry time, a fraction of a second).

var errNoSettle = errors.New("lease: the next store does not settle")

// Mark implements bucket.Settler by the next store's.
func (s *Store) Mark(ctx context.Context, m *bucket.Mark) error {
	if n, ok := s.next.(bucket.Settler); ok {
		return n.Mark(ctx, m)
	}
	return errNoSettle
}

// Settle implements bucket.Settler by the next store's.
func (s *Store) Settle(ctx context.Context, st *bucket.Settlement) (bucket.Settled, error) {
	if n, ok := s.next.(bucket.Settler); ok {
		return n.Settle(ctx, st)
	}
	return bucket.Settled{}, errNoSettle
}
