package lease

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// A key seen 10 times a second, far under its limit (1000/s), leases its own demand over
// one QuietTTL (10 s) once it has a whole QuietTTL of history: about one call per QuietTTL,
// not one per check. The tokens of a quiet lease live QuietTTL, not LeaseTTL.
func TestQuietKeyLeasesItsDemand(t *testing.T) {
	f := newFixture(t, nil) // BusyHits 3, Window 100ms, LeaseTTL 1s, QuietTTL 10s, one enforcer
	r := req("quiet", 1000, 1000, 1)
	for i := range 100 { // the first QuietTTL: exact calls
		if res := f.take(f.s, r); res.Source != bucket.SourceMemory || f.next.lastWant() != 1 {
			t.Fatalf("check %d: %+v want=%d, want an exact check", i, res, f.next.lastWant())
		}
		f.clk.Advance(100 * time.Millisecond)
	}
	before := f.next.calls.Load()
	var admitted, leased int64
	for range 300 { // three more QuietTTLs at the same pace
		res := f.take(f.s, r)
		if res.Granted != 1 {
			t.Fatalf("%+v, want granted", res)
		}
		admitted++
		if res.Source == bucket.SourceLease {
			leased++
		}
		f.s.settle()
		f.clk.Advance(100 * time.Millisecond)
	}
	if n := f.next.calls.Load() - before; n > 6 {
		t.Errorf("%d calls for 300 quiet checks over 30 s, want <= 6 (about one per QuietTTL)", n)
	}
	if leased < 290 {
		t.Errorf("%d of 300 answered from the lease, want >= 290", leased)
	}
	if g := f.next.granted.Load() - 100; admitted > g {
		t.Fatalf("admitted %d > granted %d", admitted, g)
	}
}

// A quiet lease holds no more than a quarter of one LeaseTTL of the limit per enforcer,
// whatever its demand over the longer QuietTTL: the longer life changes how long tokens
// may be stranded, not how many.
func TestQuietLeaseIsCapped(t *testing.T) {
	f := newFixture(t, nil)
	r := req("capped", 100, 1000, 1) // R × LeaseTTL / 4 = 25 tokens
	for range 200 {                  // 20/s for 10 s: demand 200 per QuietTTL ≤ R × Q / 4 = 250
		f.take(f.s, r)
		f.clk.Advance(50 * time.Millisecond)
	}
	f.take(f.s, r)
	f.s.settle()
	for _, w := range f.next.wantsCopy() {
		if w > 25 {
			t.Fatalf("a call asked %d tokens, want <= 25 (R × LeaseTTL / 4N)", w)
		}
	}
	if f.next.lastWant() != 25 {
		t.Fatalf("last call asked %d, want the capped quiet batch 25", f.next.lastWant())
	}
}

// Tokens of a quiet lease expire QuietTTL after the call that took them: dropped, counted
// as expired, never spent later.
func TestQuietLeaseExpiresAtQuietTTL(t *testing.T) {
	var expired atomic.Int64
	f := newFixture(t, func(c *Config) {
		c.Observer = func(ev Event, n int64) {
			if ev == EventExpired {
				expired.Add(n)
			}
		}
	})
	r := req("expiring", 1000, 1000, 1)
	for range 100 {
		f.take(f.s, r)
		f.clk.Advance(100 * time.Millisecond)
	}
	res := f.take(f.s, r) // a quiet lease of 100 tokens, this check spends one
	f.s.settle()
	if res.Granted != 1 || f.next.lastWant() != 100 {
		t.Fatalf("%+v want=%d, want a quiet lease of 100", res, f.next.lastWant())
	}
	f.clk.Advance(9 * time.Second) // still within QuietTTL: from the lease
	if res := f.take(f.s, r); res.Source != bucket.SourceLease {
		t.Fatalf("after 9 s: %+v, want an answer from the quiet lease", res)
	}
	if expired.Load() != 0 {
		t.Fatalf("expired %d before QuietTTL", expired.Load())
	}
	f.clk.Advance(time.Second + time.Millisecond)
	calls := f.next.calls.Load()
	if res := f.take(f.s, r); res.Source == bucket.SourceLease || f.next.calls.Load() == calls {
		t.Fatalf("after QuietTTL: %+v, want a call to the next store", res)
	}
	if expired.Load() != 98 {
		t.Fatalf("expired %d tokens, want the 98 left", expired.Load())
	}
}

// The same demand near the limit (10/s against 20/s: 4 × N × 10 > 20 × 1s) stays exact.
func TestQuietKeyNearLimitIsExact(t *testing.T) {
	f := newFixture(t, nil)
	r := req("near", 20, 20, 1)
	for i := range 30 {
		if res := f.take(f.s, r); res.Granted != 1 || f.next.lastWant() != 1 {
			t.Fatalf("check %d: %+v want=%d, want an exact grant of 1", i, res, f.next.lastWant())
		}
		f.clk.Advance(100 * time.Millisecond)
	}
	if n := f.next.calls.Load(); n != 30 {
		t.Fatalf("calls = %d, want 30", n)
	}
}

func TestQuietBatch(t *testing.T) {
	one := []bucket.Limit{{Rate: 1000, Burst: 1000}}
	for _, c := range []struct {
		name            string
		limits          []bucket.Limit
		cost, prev, cur int64
		peers           int
		want            int64
	}{
		// Q = 10 s, T = 1 s: quiet while 4 × N × cur ≤ R × 10 s, capped at R × 1 s / 4N.
		{"no history", one, 1, 0, 50, 1, 0},
		{"history under 2c", one, 1, 1, 50, 1, 0},
		{"far under", one, 1, 10, 12, 1, 12},
		{"capped at R×T/4N", one, 1, 2000, 2000, 1, 250},
		{"at R×Q/4N", one, 1, 2500, 2500, 1, 250},
		{"over R×Q/4N", one, 1, 2501, 2501, 1, 0},
		{"peers shrink the cap", one, 1, 200, 200, 3, 83},
		{"peers shrink the criterion", one, 1, 900, 900, 3, 0},
		{"slowest limit", []bucket.Limit{{Rate: 1000, Burst: 1000}, {Rate: 100, Burst: 6000}}, 1, 20, 20, 1, 20},
		{"slowest limit caps", []bucket.Limit{{Rate: 1000, Burst: 1000}, {Rate: 100, Burst: 6000}}, 1, 200, 200, 1, 25},
		{"slowest limit over", []bucket.Limit{{Rate: 1000, Burst: 1000}, {Rate: 100, Burst: 6000}}, 1, 251, 251, 1, 0},
		{"burst caps", []bucket.Limit{{Rate: 1000, Burst: 8}}, 1, 10, 10, 1, 8},
		{"slow limit: no quiet lease", []bucket.Limit{{Rate: 2, Burst: 10}}, 1, 5, 5, 1, 0},
		{"cost", one, 5, 9, 50, 1, 0},
	} {
		if got := quietBatch(c.limits, c.cost, c.prev, c.cur, c.peers, 10*time.Second, time.Second); got != c.want {
			t.Errorf("%s: quietBatch = %d, want %d", c.name, got, c.want)
		}
	}
}
