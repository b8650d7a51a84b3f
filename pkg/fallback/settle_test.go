package fallback

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// settleNext is a fakeNext that also settles (in memory), failing with its shard's mode
// "down" like its takes.
type settleNext struct {
	*heldNext
}

func (n *settleNext) Mark(ctx context.Context, m *bucket.Mark) error {
	if n.down(m.Identity) {
		return errDown
	}
	return n.mem.Mark(ctx, m)
}

func (n *settleNext) Settle(ctx context.Context, s *bucket.Settlement) (bucket.Settled, error) {
	if n.down(s.Identity) {
		return bucket.Settled{}, errDown
	}
	return n.mem.Settle(ctx, s)
}

// While the shard answers, marks and settlements go to the next store; while its breaker
// is open a mark is not recorded, a marked settlement is refused (the estimate stands,
// nothing is paid without its marker) and an unmarked one is applied to the local limits.
func TestSettleDuringOutage(t *testing.T) {
	ctx := context.Background()
	h, held := newHeldHarness(t, func(c *Config) { c.Peers = func() int { return 4 } })
	h.s.Close()
	next := &settleNext{held}
	s, err := New(next, h.s.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	h.s = s
	lim := []bucket.Limit{{Name: "r", Rate: 1.0 / 1024, Burst: 8}}
	mark := &bucket.Mark{Identity: "a:k", ID: "m", Estimate: 2, Cost: 1, TTL: time.Minute}
	if err := s.Mark(ctx, mark); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Settle(ctx, &bucket.Settlement{Identity: "a:k", Limits: lim, ID: "m", Actual: 5}); err != nil || r.Delta != 3 || r.Source != bucket.SourceMemory {
		t.Fatalf("healthy settlement: %+v %v", r, err)
	}
	if err := s.Mark(ctx, &bucket.Mark{Identity: "a:k", ID: "later", Estimate: 2, Cost: 1, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	h.trip(t, "a")
	if err := s.Mark(ctx, mark); !errors.Is(err, bucket.ErrUnavailable) {
		t.Fatalf("mark while down: %v, want ErrUnavailable", err)
	}
	if _, err := s.Settle(ctx, &bucket.Settlement{Identity: "a:k", Limits: lim, ID: "later", Actual: 0}); !errors.Is(err, bucket.ErrUnavailable) {
		t.Fatalf("marked settlement while down: %v, want ErrUnavailable", err)
	}
	// Unmarked: local limits are 8 × Slack 2 / 4 = 4; a take of 10 leaves the local bucket
	// one local burst in debt, a refund of 100 fills it to the local burst.
	r, err := s.Settle(ctx, &bucket.Settlement{Identity: "a:k", Limits: lim, Delta: 10})
	if err != nil || r.Source != bucket.SourceFallback || r.Remaining != -4 {
		t.Fatalf("unmarked settlement while down: %+v %v, want -4 locally", r, err)
	}
	if res := h.take(t, &bucket.Request{Identity: "a:k", Limits: lim, Want: 1}); res.Granted != 0 || res.Source != bucket.SourceFallback {
		t.Fatalf("a local take in debt: %+v", res)
	}
	if r, err := s.Settle(ctx, &bucket.Settlement{Identity: "a:k", Limits: lim, Delta: -100}); err != nil || r.Remaining != 4 {
		t.Fatalf("unmarked refund while down: %+v %v, want the local burst 4", r, err)
	}
	// The marker kept in the next store is settled once the shard is back.
	h.next.set("a", healthy)
	h.clk.Advance(3 * time.Second)
	for i := 0; i < 3 && s.State("a") != Closed; i++ {
		h.take(t, &bucket.Request{Identity: "a:probe", Limits: lim, Want: 1})
		h.clk.Advance(3 * time.Second)
	}
	if r, err := s.Settle(ctx, &bucket.Settlement{Identity: "a:k", Limits: lim, ID: "later", Actual: 0}); err != nil || r.Delta != -2 {
		t.Fatalf("marked settlement once the shard is back (state %v): %+v %v", s.State("a"), r, err)
	}
}
