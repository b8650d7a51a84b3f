package fallback

import (
	"context"
	"fmt"
	"math"

	"github.com/allot-dev/allot/pkg/bucket"
)

// Settlements (bucket.Settler) through the Store.
//
// While a key's shard breaker is closed, a mark or a settlement calls the next store with
// ReplyTimeout as its deadline. The breakers are moved by rate takes only.
//
// While it is open, or when that call fails:
//   - a mark is not recorded (bucket.ErrUnavailable): the check is answered without a
//     settlement handle and its estimate stands;
//   - a settlement of a marker (Settlement.ID) is refused with bucket.ErrUnavailable and
//     changes nothing: the marker is in Redis, out of reach, and a refund must not be paid
//     without it. The caller may send it again once the shard is back, within the
//     marker's TTL; otherwise the estimate stands (a settlement lost: under for a request
//     that cost more than its estimate, over for one that cost less);
//   - a settlement without a marker (Envoy's hits on stream done and negative hits) is
//     applied to the local limits, scaled as the local takes are (limit × Slack / N):
//     the local buckets go into debt or are refunded, bounded as in Redis by their local
//     burst. It is not applied to Redis later (the local counts are forgotten when the
//     shard is back, as every local take is).

// Mark implements bucket.Settler.
func (s *Store) Mark(ctx context.Context, m *bucket.Mark) error {
	if s.closed.Load() {
		return ErrClosed
	}
	if err := m.Validate(); err != nil {
		return err
	}
	b := s.breakerFor(m.Identity)
	if stateOf(b.word.Load()) != Closed || s.settler == nil {
		return fmt.Errorf("%w: shard %s: settlement not marked, the estimate stands", bucket.ErrUnavailable, b.shard)
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.ReplyTimeout)
	defer cancel()
	return s.settler.Mark(cctx, m)
}

// Settle implements bucket.Settler.
func (s *Store) Settle(ctx context.Context, st *bucket.Settlement) (bucket.Settled, error) {
	if s.closed.Load() {
		return bucket.Settled{}, ErrClosed
	}
	if err := st.Validate(); err != nil {
		return bucket.Settled{}, err
	}
	b := s.breakerFor(st.Identity)
	if stateOf(b.word.Load()) == Closed && s.settler != nil {
		cctx, cancel := context.WithTimeout(ctx, s.cfg.ReplyTimeout)
		res, err := s.settler.Settle(cctx, st)
		cancel()
		if err == nil || st.ID != "" {
			return res, err
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return bucket.Settled{}, ctxErr
		}
	} else if st.ID != "" {
		return bucket.Settled{}, fmt.Errorf("%w: shard %s: the settlement's marker is out of reach; send it again when the shard is back", bucket.ErrUnavailable, b.shard)
	}
	return s.settleLocally(st), nil
}

// settleLocally applies an unmarked settlement to the local limits.
func (s *Store) settleLocally(st *bucket.Settlement) bucket.Settled {
	f := s.cfg.Slack / float64(s.peersFor(st.Identity))
	var lim [bucket.MaxLimits]bucket.Limit
	for i, l := range st.Limits {
		rate, burst := l.Rate*f, l.Burst*f
		if rate <= 0 {
			rate = math.SmallestNonzeroFloat64
		}
		burst = max(burst, 1)
		lim[i] = bucket.Limit{Name: l.Name, Rate: rate, Burst: burst}
	}
	local := bucket.Settlement{Identity: st.Identity, Limits: lim[:len(st.Limits)], Delta: st.Delta}
	res, _ := s.local.SettleAt(&local, s.clock.Now().UnixMicro()) // unmarked: never ErrNotMarked
	res.Source = bucket.SourceFallback
	return res
}
