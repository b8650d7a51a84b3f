package fallback

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// Tests of the answers given while a shard is unavailable: local limits, fail-closed
// refusals, the local table's bound.

func TestLocalLimits(t *testing.T) {
	for _, tc := range []struct {
		name         string
		peers        int
		slack        float64
		rate, burst  float64
		want, min    int64
		seconds      int
		wantAdmitted int64
		seen         int // Config.Seen's count for the key (0: none)
	}{
		// rate' = 10×2/4 = 5/s, burst' = 20×2/4 = 10: 10 + 5×10 s.
		{"N=4 slack 2", 4, 2, 10, 20, 1, 0, 10, 10 + 50, 0},
		// rate' = 20/s, burst' = 40 (still below the offered 100/s).
		{"N=1 slack 2", 1, 2, 10, 20, 1, 0, 10, 40 + 200, 0},
		// rate' = 10×1/10 = 1/s, burst' = 2.
		{"N=10 slack 1", 10, 1, 10, 20, 1, 0, 10, 2 + 10, 0},
		// burst' = 3×2/100 = 0.06 → at least 1; rate' = 0.2/s: 1 + 2.
		{"burst at least 1", 100, 2, 10, 3, 1, 0, 10, 1 + 2, 0},
		// cost 5 (Min = Want = 5): burst' = max(20×2/100, 5) = 5, rate' = 0.2/s.
		// Tokens: 5 at t=0, then 5 more after 25 s: two grants of 5 in 30 s.
		{"burst at least the cost", 100, 2, 10, 20, 5, 0, 30, 10, 0},
		// A key served by 2 of 10 enforcers: rate' = 10×2/2 = 10/s, burst' = 20.
		{"served by 2 of 10", 10, 2, 10, 20, 1, 0, 10, 20 + 100, 2},
		// A count above N is not believed: N=4 as above.
		{"seen above N", 4, 2, 10, 20, 1, 0, 10, 10 + 50, 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) {
				c.Peers = func() int { return tc.peers }
				c.Slack = tc.slack
				c.OpenFor = time.Hour // no probe during the timeline
				c.Seen = func(id string) int {
					if id != "a:busy" {
						return 0 // the harness's key that trips the breaker
					}
					return tc.seen
				}
			})
			h.trip(t, "a")
			r := req("a:busy", tc.rate, tc.burst)
			r.Want, r.Min = tc.want, tc.min
			var admitted int64
			for step := 0; step <= tc.seconds*100; step++ { // every 10 ms, both ends included
				res := h.take(t, r)
				if res.Source != bucket.SourceFallback {
					t.Fatalf("step %d: source %v", step, res.Source)
				}
				if res.Granted == 0 && res.RetryAfter <= 0 {
					t.Fatalf("step %d: refused with RetryAfter %v", step, res.RetryAfter)
				}
				admitted += res.Granted
				h.clk.Advance(10 * time.Millisecond)
			}
			if admitted != tc.wantAdmitted {
				t.Fatalf("admitted %d tokens over %d s, want %d", admitted, tc.seconds, tc.wantAdmitted)
			}
		})
	}
}

func TestPeersBelowOneMeansOne(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Peers = func() int { return 0 }; c.OpenFor = time.Hour })
	h.trip(t, "a")
	var admitted int64
	for i := 0; i < 100; i++ {
		admitted += h.take(t, req("a:k", 1, 10)).Granted
	}
	if admitted != 20 { // burst 10 × Slack 2 / 1
		t.Fatalf("admitted %d, want 20", admitted)
	}
}

func TestFailClosed(t *testing.T) {
	h := newHarness(t, nil)
	closedReq := req("a:login", 100, 100)
	closedReq.FailClosed = true

	if res := h.take(t, closedReq); res.Source != bucket.SourceRedis || res.Granted != 1 {
		t.Fatalf("healthy shard: fail-closed request got %+v", res)
	}

	// An unavailable shard: the request is not answered but returned as ErrUnavailable
	// with the wait until the shard is next tried; pkg/enforcer refuses it.
	unavailable := func(what string, want time.Duration) {
		t.Helper()
		res, err := h.s.Take(context.Background(), closedReq)
		if !errors.Is(err, bucket.ErrUnavailable) || res.Granted != 0 || res.Source != bucket.SourceFailClosed || res.RetryAfter != want {
			t.Fatalf("%s: got %+v, %v; want ErrUnavailable, retry after %v", what, res, err, want)
		}
	}
	h.next.set("a", down)
	for i := 1; i <= DefaultTripAfter; i++ {
		want := DefaultTimeout // closed breaker: the next check tries the shard again
		if i == DefaultTripAfter {
			want = DefaultFirstOpenFor // this failure opened it: until the probe
		}
		unavailable(fmt.Sprintf("failure %d", i), want)
	}
	h.clk.Advance(100 * time.Millisecond)
	unavailable("open", DefaultFirstOpenFor-100*time.Millisecond)
	// A fail-open key on the same shard is still admitted locally.
	if res := h.take(t, req("a:search", 100, 100)); res.Source != bucket.SourceFallback || res.Granted != 1 {
		t.Fatalf("open, fail-open key: %+v", res)
	}

	h.next.set("a", healthy)
	h.clk.Advance(1500 * time.Millisecond)
	if res := h.take(t, closedReq); res.Source != bucket.SourceRedis || res.Granted != 1 {
		t.Fatalf("probe of a fail-closed request: %+v, want granted from redis", res)
	}
	if res := h.take(t, closedReq); res.Source != bucket.SourceRedis || res.Granted != 1 {
		t.Fatalf("closed again: %+v", res)
	}
}

func TestLocalTableIsBounded(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxLocalKeys = 640; c.OpenFor = time.Hour })
	h.trip(t, "a")
	for i := 0; i < 20_000; i++ {
		if res := h.take(t, req(fmt.Sprintf("a:invented-%d", i), 1, 5)); res.Granted != 1 {
			t.Fatalf("new identity %d refused", i)
		}
	}
	if n := h.s.LocalKeys(); n > 640 {
		t.Fatalf("local table holds %d identities, bound 640", n)
	}
}

func TestOpenPathAllocations(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.OpenFor = time.Hour })
	h.trip(t, "a")
	r := req("a:k", 1e6, 1e6)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		if res, err := h.s.Take(ctx, r); err != nil || res.Source != bucket.SourceFallback {
			t.Fatal(res, err)
		}
	})
	if allocs > 0 {
		t.Fatalf("open path: %v allocations per check, want 0", allocs)
	}
}
