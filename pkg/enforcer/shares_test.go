package enforcer

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/enforcer/overrides"
	"github.com/allot-dev/allot/pkg/lease"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/allot-dev/allot/pkg/testenv"
)

// mapShares is a Shares fake: identity → share, the rule's default for the rest.
type mapShares struct {
	mu sync.Mutex // mu guards m
	m  map[string]float64
}

func (s *mapShares) set(id string, v float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]float64{}
	}
	s.m[id] = v
}

func (s *mapShares) Share(r *rules.Compiled, id string, _ time.Time) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v, ok := s.m[id]; ok {
		return v
	}
	return r.Share
}

// One region, so the default share is 1: 10/s, burst 20.
const shareRules = `
rules:
  - id: default
    limits: [{name: second, rate: 10, per: 1s, burst: 20}]
`

func TestShareHalvesRegionalRateAndBurst(t *testing.T) {
	sh := &mapShares{}
	sh.set("key:half", 0.5)
	r := newRig(t, shareRules, nil, func(c *Config) { c.Shares = sh })
	half, whole := rules.Attrs{APIKey: "half"}, rules.Attrs{APIKey: "whole"}

	if n, d := r.admitted(t, 30, half); n != 10 || d.Quota != 10 || d.Share != 0.5 {
		t.Fatalf("share 0.5: %d admitted at once (quota %d, share %g), want burst 10", n, d.Quota, d.Share)
	}
	if n, d := r.admitted(t, 30, whole); n != 20 || d.Quota != 20 || d.Share != 1 {
		t.Fatalf("default share: %d admitted at once (quota %d, share %g), want burst 20", n, d.Quota, d.Share)
	}
	r.clk.Advance(time.Second)
	if n, _ := r.admitted(t, 30, half); n != 5 {
		t.Fatalf("share 0.5: %d refilled in 1s, want rate 5", n)
	}
	if n, _ := r.admitted(t, 30, whole); n != 10 {
		t.Fatalf("default share: %d refilled in 1s, want rate 10", n)
	}
	// The allowed decision states the scaled budget.
	r.clk.Advance(10 * time.Second)
	if d := r.check(t, half); !d.Allowed || d.Quota != 10 || d.Remaining != 9 || d.Window != 2 || d.Limit != "default/second" {
		t.Fatalf("decision %+v", d)
	}
}

// A decrease takes effect on the next take: tokens above the new burst go (the memory
// store clamps to the request's burst). An increase adds no tokens at once to a bucket in
// use: it refills at the new rate.
func TestShareDecreaseAndIncreaseMemory(t *testing.T) {
	sh := &mapShares{}
	r := newRig(t, shareRules, nil, func(c *Config) { c.Shares = sh })
	a := rules.Attrs{APIKey: "k"}
	if d := r.check(t, a); d.Remaining != 19 {
		t.Fatalf("remaining %d, want 19", d.Remaining)
	}
	sh.set("key:k", 0.25) // burst 5, rate 2.5
	if d := r.check(t, a); d.Remaining != 4 || d.Quota != 5 {
		t.Fatalf("after the decrease: remaining %d of %d, want 4 of 5 (tokens above the new burst gone)", d.Remaining, d.Quota)
	}
	if n, _ := r.admitted(t, 10, a); n != 4 {
		t.Fatalf("after the decrease: %d admitted, want 4", n)
	}
	sh.set("key:k", 1) // burst 20, rate 10: the empty bucket refills at 10/s, nothing at once
	if n, _ := r.admitted(t, 10, a); n != 0 {
		t.Fatalf("the increase added %d tokens at once", n)
	}
	r.clk.Advance(500 * time.Millisecond)
	if n, _ := r.admitted(t, 30, a); n != 5 {
		t.Fatalf("%d admitted after 0.5s at the new rate, want 5", n)
	}

	// The bound documented on Shares: an idle, full bucket reads as full at the new burst.
	idle := rules.Attrs{APIKey: "idle"}
	sh.set("key:idle", 0.25)
	if n, _ := r.admitted(t, 1, idle); n != 1 {
		t.Fatal("idle key refused")
	}
	r.clk.Advance(time.Minute) // full again at burst 5, and forgotten by the store
	sh.set("key:idle", 1)
	if n, _ := r.admitted(t, 30, idle); n != 20 {
		t.Fatalf("an idle bucket after an increase: %d admitted at once, want the new burst 20 (documented)", n)
	}
}

// The same on real Redis: the script clamps the stored tokens to the request's burst.
func TestShareDecreaseRedis(t *testing.T) {
	n := testenv.Redis(t)
	st, err := bucket.NewRedis(n.Client(), bucket.RedisOptions{KeyPrefix: fmt.Sprintf("t%d:", time.Now().UnixNano())})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sh := &mapShares{}
	// 100 an hour: nothing refills during the test, whatever the server's clock does.
	r := newRig(t, "rules:\n  - id: default\n    limits: [{name: hour, rate: 100, per: 1h}]\n",
		func(clock.Clock) bucket.Store { return st }, func(c *Config) { c.Shares = sh })
	a := rules.Attrs{APIKey: "k"}
	if d := r.check(t, a); !d.Allowed || d.Remaining != 99 || d.Source != SourceRedis {
		t.Fatalf("decision %+v", d)
	}
	sh.set("key:k", 0.1) // burst 10
	if d := r.check(t, a); !d.Allowed || d.Remaining != 9 || d.Quota != 10 {
		t.Fatalf("after the decrease: %+v, want remaining 9 of 10", d)
	}
	if got, _ := r.admitted(t, 20, a); got != 9 {
		t.Fatalf("after the decrease: %d admitted, want 9", got)
	}
	sh.set("key:k", 1)
	if got, _ := r.admitted(t, 5, a); got != 0 {
		t.Fatalf("the increase added %d tokens at once", got)
	}
}

// A lease taken under the old share is dropped when the share changes: pkg/lease compares
// the request's limits with the ones it leased under.
func TestShareChangeDropsLease(t *testing.T) {
	clk := clock.NewFake(t0)
	var mu sync.Mutex
	events := map[lease.Event]int64{}
	lc := lease.DefaultConfig()
	lc.Clock = clk
	lc.Observer = func(ev lease.Event, n int64) { mu.Lock(); events[ev] += n; mu.Unlock() }
	// Refills inside the Take that made them due: the events are all counted when Check
	// returns (a background refill raced the counts below: 1 run in ~20 under load).
	lc.SyncRefill = true
	ls, err := lease.New(bucket.NewMemory(clk, 0), lc)
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	sh := &mapShares{}
	// 10,000/s: a busy key leases more than it spends (a batch covers its local demand).
	r := newRig(t, "rules:\n  - id: default\n    limits: [{name: second, rate: 10000, per: 1s}]\n",
		func(clock.Clock) bucket.Store { return ls }, func(c *Config) { c.Shares = sh; c.Clock = clk })
	r.clk = clk
	a := rules.Attrs{APIKey: "busy"}
	var last Decision
	for range 20 {
		last = r.check(t, a)
	}
	mu.Lock()
	granted := events[lease.EventGranted]
	mu.Unlock()
	if last.Source != SourceLease || granted <= 20 {
		t.Fatalf("no lease taken (source %v, granted %d)", last.Source, granted)
	}
	sh.set("key:busy", 0.5)
	d := r.check(t, a)
	mu.Lock()
	dropped := events[lease.EventLimitsChanged]
	mu.Unlock()
	if dropped == 0 {
		t.Fatal("the lease taken under share 1 was not dropped when the share halved")
	}
	if d.Quota != 5000 || d.Share != 0.5 {
		t.Fatalf("decision %+v, want quota 5000 at share 0.5", d)
	}
}

// The production Holder plugs in as Shares.
func TestHolderAsShares(t *testing.T) {
	cfg := overrides.DefaultConfig()
	cfg.Region, cfg.Clock = "us-east", clock.NewFake(t0)
	h, err := overrides.NewHolder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.Apply(contract.Head{LeaderRev: 1, Version: 1, PublishedAt: t0},
		[]contract.Entry{{Rule: "default", Identity: "key:half", Shares: map[string]float64{"us-east": 0.5, "eu-west": 0.5}}}, t0)
	r := newRig(t, shareRules, nil, func(c *Config) { c.Shares = h })
	if n, _ := r.admitted(t, 30, rules.Attrs{APIKey: "half"}); n != 10 {
		t.Fatalf("%d admitted, want 10", n)
	}
	// Stale: min(0.5, default 1) = 0.5 still; the default split applies to the rest.
	r.clk.Advance(overrides.DefaultStale)
	if n, _ := r.admitted(t, 30, rules.Attrs{APIKey: "other"}); n != 20 {
		t.Fatalf("%d admitted, want 20", n)
	}
}

func TestShareCheckAllocations(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation count is measured in full runs")
	}
	r := shareBenchRig(t)
	req := Request{Attrs: rules.Attrs{APIKey: "key-1", Plan: "pro", Endpoint: "GET /v1/search"}}
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := r.e.Check(ctx, &req); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("Check with a rescaling share allocates %v times per call, want 0", allocs)
	}
}

// shareBenchRig is benchRig with a Holder listing every bench key at share 0.5 for the
// default rule (so each check rescales) and nothing for the others.
func shareBenchRig(b testing.TB) *rig {
	cfg := overrides.DefaultConfig()
	cfg.Region = "us-east"
	h, err := overrides.NewHolder(cfg)
	if err != nil {
		b.Fatal(err)
	}
	es := make([]contract.Entry, 1024)
	for i := range es {
		es[i] = contract.Entry{Rule: "default", Identity: fmt.Sprintf("key:key-%d", i), Shares: map[string]float64{"us-east": 0.5}}
	}
	now := time.Now()
	h.Apply(contract.Head{LeaderRev: 1, Version: 1, PublishedAt: now}, es, now)
	return newRig(b, benchRules, func(clock.Clock) bucket.Store { return bucket.NewMemory(clock.Real(), 0) },
		func(c *Config) { c.Clock = clock.Real(); c.Shares = h })
}

// BenchmarkShareCheck is BenchmarkCheck with shares off (no Shares) and on (a Holder that
// lists every key, so the default rule's limits are rescaled on every check).
func BenchmarkShareCheck(b *testing.B) {
	for _, tc := range []struct {
		name string
		rig  func(testing.TB) *rig
	}{{"off", benchRig}, {"on", shareBenchRig}} {
		b.Run(tc.name, func(b *testing.B) {
			r := tc.rig(b)
			reqs := benchKeys(1024)
			ctx := context.Background()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, err := r.e.Check(ctx, &reqs[i&1023]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// callCounter counts the takes that reach the store below it.
type callCounter struct {
	bucket.Store
	mu sync.Mutex // mu guards n
	n  int
}

func (c *callCounter) Take(ctx context.Context, r *bucket.Request) (bucket.Result, error) {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return c.Store.Take(ctx, r)
}

// Small limits (docs/design.md §9, issue 21 §1c): a region whose share of a 1-a-minute, burst-1
// rule is under one token holds none: it refuses from memory, without a store call, and
// counts the refusal as demand so its report asks the balancer for a token. With the
// whole token it admits exactly one.
func TestShareUnderOneTokenRefuses(t *testing.T) {
	const small = `
rules:
  - id: reset
    limits: [{name: minute, rate: 1, per: 1m, burst: 1}]
`
	sh := &mapShares{}
	sh.set("key:a", 0.5)
	sh.set("key:b", 1)
	u := &usageLog{}
	var store *callCounter
	r := newRig(t, small, func(c clock.Clock) bucket.Store {
		store = &callCounter{Store: bucket.NewMemory(c, 0)}
		return store
	}, func(c *Config) { c.Shares, c.Usage = sh, u })
	d := r.check(t, rules.Attrs{APIKey: "a"})
	if d.Allowed || d.Source != SourceRefusalCache || d.Rule != "reset" || d.Quota != 0 || d.Share != 0.5 || d.RetryAfter != time.Minute {
		t.Fatalf("half a token: %+v", d)
	}
	if store.n != 0 {
		t.Fatalf("%d store calls for a region holding no tokens", store.n)
	}
	if len(u.takes) != 1 || u.takes[0] != "reset key:a refused refusal-cache 1" {
		t.Fatalf("usage %q", u.takes)
	}
	if n, _ := r.admitted(t, 5, rules.Attrs{APIKey: "b"}); n != 1 {
		t.Fatalf("the whole token: %d admitted, want 1", n)
	}
	// Shadow rules holding no tokens would refuse, and never call the store either.
	r2 := newRig(t, small+"    mode: shadow\n", nil, func(c *Config) { c.Shares = sh })
	if d := r2.check(t, rules.Attrs{APIKey: "a"}); !d.Allowed || d.shadowN != 1 {
		t.Fatalf("shadow: %+v", d)
	}
}
