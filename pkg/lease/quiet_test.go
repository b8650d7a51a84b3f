package lease

import (
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// A key seen 10 times a second, far under its limit (1000/s), leases its own demand over
// one LeaseTTL once it has a whole TTL of history: about one call per TTL, not per check.
func TestQuietKeyLeasesItsDemand(t *testing.T) {
	f := newFixture(t, nil) // BusyHits 3, Window 100ms, LeaseTTL 1s, one enforcer
	r := req("quiet", 1000, 1000, 1)
	for i := range 10 { // the first TTL: exact calls
		if res := f.take(f.s, r); res.Source != bucket.SourceMemory || f.next.lastWant() != 1 {
			t.Fatalf("check %d: %+v want=%d, want an exact check", i, res, f.next.lastWant())
		}
		f.clk.Advance(100 * time.Millisecond)
	}
	before := f.next.calls.Load()
	var admitted int64
	for range 30 { // three more TTLs at the same pace
		res := f.take(f.s, r)
		if res.Granted != 1 {
			t.Fatalf("%+v, want granted", res)
		}
		admitted++
		f.s.settle()
		f.clk.Advance(100 * time.Millisecond)
	}
	if n := f.next.calls.Load() - before; n > 8 {
		t.Errorf("%d calls for 30 quiet checks, want <= 8 (about one per TTL)", n)
	}
	if g := f.next.granted.Load() - 10; admitted > g {
		t.Fatalf("admitted %d > granted %d", admitted, g)
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
		{"no history", one, 1, 0, 50, 1, 0},
		{"history under 2c", one, 1, 1, 50, 1, 0},
		{"far under", one, 1, 10, 12, 1, 12},
		{"at R/4N", one, 1, 250, 250, 1, 250},
		{"over R/4N", one, 1, 251, 251, 1, 0},
		{"peers shrink it", one, 1, 100, 100, 3, 0},
		{"slowest limit", []bucket.Limit{{Rate: 1000, Burst: 1000}, {Rate: 100, Burst: 6000}}, 1, 20, 20, 1, 20},
		{"slowest limit over", []bucket.Limit{{Rate: 1000, Burst: 1000}, {Rate: 100, Burst: 6000}}, 1, 26, 26, 1, 0},
		{"burst caps", []bucket.Limit{{Rate: 1000, Burst: 8}}, 1, 10, 10, 1, 8},
		{"cost", one, 5, 9, 50, 1, 0},
	} {
		if got := quietBatch(c.limits, c.cost, c.prev, c.cur, c.peers, time.Second); got != c.want {
			t.Errorf("%s: quietBatch = %d, want %d", c.name, got, c.want)
		}
	}
}
