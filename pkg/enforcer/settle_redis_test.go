package enforcer

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/fallback"
	"github.com/allot-dev/allot/pkg/lease"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/allot-dev/allot/pkg/testenv"
)

const settleRules = `
rules:
  - id: llm
    limits:
      - {name: hour, rate: 1000, per: 1h}
`

// settleEnforcer is one enforcer over its own production stack (fallback → lease →
// Redis Cluster, its own client): two of them are two enforcers of a region.
func settleEnforcer(t *testing.T, cl *testenv.Cluster) (*rig, *bucket.Redis) {
	t.Helper()
	rs, err := bucket.NewRedis(cl.Client(), bucket.RedisOptions{KeyPrefix: "settle-test:"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rs.Close() })
	clk := clock.NewFake(t0)
	lc := lease.DefaultConfig()
	lc.Clock = clk
	ls, err := lease.New(rs, lc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ls.Close() })
	fc := fallback.DefaultConfig()
	fc.Clock = clk
	fs, err := fallback.New(ls, fc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fs.Close() })
	return newRig(t, settleRules, func(clock.Clock) bucket.Store { return fs }, func(c *Config) { c.Clock = clk }), rs
}

// level reads the identity's bucket in Redis (the rule's one limit).
func level(t *testing.T, r *rig, rs *bucket.Redis, identity string) float64 {
	t.Helper()
	lim := r.h.Current().Rule("llm").Limits
	v, err := rs.Peek(context.Background(), identity, lim, nil)
	if err != nil || len(v) != 1 {
		t.Fatalf("Peek: %v %v", v, err)
	}
	return v[0]
}

// Settlements through the production stack on a real Redis Cluster: a check with an
// estimate, settled up (the bucket lower by the difference) and down (refunded, never
// above the burst); a second settlement, an unknown or edited handle refused; two
// enforcers settling one handle at once: exactly one succeeds.
func TestSettleRedisCluster(t *testing.T) {
	ctx := context.Background()
	cl := testenv.RedisCluster(t, testenv.ClusterOptions{Masters: 3})
	ea, rs := settleEnforcer(t, cl)
	eb, _ := settleEnforcer(t, cl)
	a := rules.Attrs{APIKey: "settle-k"}
	const id = "key:settle-k"
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1 { // the bucket refills 1000 an hour while the test runs
			t.Fatalf("%s: bucket at %.3f, want %.3f", what, got, want)
		}
	}

	d, err := ea.e.Check(ctx, &Request{Attrs: a, Hits: 100, Settle: true})
	if err != nil || !d.Allowed || d.SettleHandle == "" {
		t.Fatalf("check with an estimate of 100: %+v %v, want allowed with a settle handle", d, err)
	}
	l0 := level(t, ea, rs, id)
	if l0 > 900+1 {
		t.Fatalf("after an estimate of 100 the bucket holds %.3f of 1000", l0)
	}
	// Up: 300 actual, 200 more than the estimate.
	res, err := eb.e.Settle(ctx, d.SettleHandle, 300)
	if err != nil || res.Settled != 1 || res.Rule != "llm" {
		t.Fatalf("settle up: %+v %v", res, err)
	}
	near("settled up by 200", level(t, ea, rs, id), l0-200)
	// Twice: refused, on either enforcer, and nothing moves.
	for _, r := range []*rig{ea, eb} {
		if _, err := r.e.Settle(ctx, d.SettleHandle, 0); !errors.Is(err, ErrUnknownSettle) {
			t.Fatalf("second settlement: %v, want ErrUnknownSettle", err)
		}
	}
	near("after refused settlements", level(t, ea, rs, id), l0-200)

	// Down: an estimate of 50, 10 actual: 40 back.
	d, _ = ea.e.Check(ctx, &Request{Attrs: a, Hits: 50, Settle: true})
	l1 := level(t, ea, rs, id)
	if res, err := ea.e.Settle(ctx, d.SettleHandle, 10); err != nil || res.Settled != 1 {
		t.Fatalf("settle down: %+v %v", res, err)
	}
	near("settled down by 40", level(t, ea, rs, id), l1+40)

	// A refund never fills past the burst: the bucket refilled by negative hits first.
	d, _ = ea.e.Check(ctx, &Request{Attrs: a, Hits: 500, Settle: true})
	if n, err := ea.e.Refund(ctx, &Request{Attrs: a, Hits: 1000}); err != nil || n != 1 {
		t.Fatalf("Refund: %d %v", n, err)
	}
	if _, err := ea.e.Settle(ctx, d.SettleHandle, 0); err != nil {
		t.Fatal(err)
	}
	if got := level(t, ea, rs, id); got != 1000 {
		t.Fatalf("a refund of 500 to a full bucket: %.3f, want the burst 1000", got)
	}

	// Unknown, edited and malformed handles.
	if _, err := ea.e.Settle(ctx, encodeSettle(newSlotID(), []settleTake{{rule: "llm", identity: id}}), 0); !errors.Is(err, ErrUnknownSettle) {
		t.Fatalf("unknown handle: %v, want ErrUnknownSettle", err)
	}
	d, _ = ea.e.Check(ctx, &Request{Attrs: a, Hits: 5, Settle: true})
	mid, _, _ := decodeSettle(d.SettleHandle)
	if _, err := ea.e.Settle(ctx, encodeSettle(mid, []settleTake{{rule: "llm", identity: "key:someone-else"}}), 0); !errors.Is(err, ErrUnknownSettle) {
		t.Fatalf("a handle edited to another identity: %v, want ErrUnknownSettle", err)
	}
	if _, err := ea.e.Settle(ctx, "s1.nope", 0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("malformed handle: %v, want ErrInvalid", err)
	}

	// Two enforcers receive each handle at once: exactly one settles it.
	for i := range 10 {
		d, err := ea.e.Check(ctx, &Request{Attrs: a, Hits: 20, Settle: true})
		if err != nil || d.SettleHandle == "" {
			t.Fatalf("check %d: %+v %v", i, d, err)
		}
		before := level(t, ea, rs, id)
		var won atomic.Int32
		var wg sync.WaitGroup
		for _, r := range []*rig{ea, eb} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := r.e.Settle(ctx, d.SettleHandle, 0)
				switch {
				case err == nil:
					won.Add(1)
				case !errors.Is(err, ErrUnknownSettle):
					t.Errorf("concurrent settle: %v", err)
				}
			}()
		}
		wg.Wait()
		if n := won.Load(); n != 1 {
			t.Fatalf("round %d: %d of 2 concurrent settlements succeeded, want exactly 1", i, n)
		}
		near("one refund of 20", level(t, ea, rs, id), min(before+20, 1000))
	}
}
