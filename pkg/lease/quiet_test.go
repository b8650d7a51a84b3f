package lease

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// quiet10s sets QuietTTL to 10 s, the period these tests' figures are worked out for (the
// default is 30 s).
func quiet10s(c *Config) { c.QuietTTL = 10 * time.Second }

// A key seen 10 times a second, far under its limit (1000/s), is exact for its first
// LeaseTTL, then leases its own demand over one QuietTTL (10 s): once the period has
// filled, about one call per QuietTTL, not one per check.
func TestQuietKeyLeasesItsDemand(t *testing.T) {
	f := newFixture(t, quiet10s) // BusyHits 3, Window 100ms, LeaseTTL 1s, QuietTTL 10s, one enforcer
	r := req("quiet", 1000, 1000, 1)
	f.opens(r)
	f.clk.Advance(100 * time.Millisecond)
	for i := 2; i < 10; i++ { // the rest of the first LeaseTTL: exact calls
		if res := f.take(f.s, r); res.Source != bucket.SourceMemory || f.next.lastWant() != 1 {
			t.Fatalf("check %d: %+v want=%d, want an exact check", i, res, f.next.lastWant())
		}
		f.clk.Advance(100 * time.Millisecond)
	}
	var admitted, leased int64
	check := func() {
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
	for range 90 { // the rest of the first QuietTTL: the batch grows toward the demand
		check()
	}
	if n := f.next.calls.Load() - 9; n > 8 {
		t.Errorf("%d calls for 90 checks while the first QuietTTL fills, want <= 8", n)
	}
	before, leased := f.next.calls.Load(), int64(0)
	for range 300 { // three more QuietTTLs at the same pace
		check()
	}
	if n := f.next.calls.Load() - before; n > 5 {
		t.Errorf("%d calls for 300 quiet checks over 30 s, want <= 5 (about one per QuietTTL)", n)
	}
	if leased < 295 {
		t.Errorf("%d of 300 answered from the lease, want >= 295", leased)
	}
	if g := f.next.granted.Load() - 10; admitted > g {
		t.Fatalf("admitted %d > granted %d", admitted, g)
	}
}

// A quiet lease holds no more than a quarter of one LeaseTTL of the limit per enforcer,
// whatever its demand over the longer QuietTTL: the longer life changes how long tokens
// may be stranded, not how many.
func TestQuietLeaseIsCapped(t *testing.T) {
	f := newFixture(t, quiet10s)
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
// as expired, never spent later, but for the one check that finds them expired (the lapsed
// check), which spends its own cost and renews the lease in the background.
func TestQuietLeaseExpiresAtQuietTTL(t *testing.T) {
	var expired, refills atomic.Int64
	f := newFixture(t, func(c *Config) {
		quiet10s(c)
		c.Observer = func(ev Event, n int64) {
			switch ev {
			case EventExpired:
				expired.Add(n)
			case EventRefill:
				refills.Add(1)
			}
		}
	})
	r := req("expiring", 1000, 1000, 1)
	for range 10 {
		f.take(f.s, r)
		f.clk.Advance(100 * time.Millisecond)
	}
	// 11 checks in 1 s: a quiet lease of 11 × 10 s / (1 s + 1 s) = 55, this check spends one.
	res := f.take(f.s, r)
	f.s.settle()
	if res.Granted != 1 || f.next.lastWant() != 55 {
		t.Fatalf("%+v want=%d, want a quiet lease of 55", res, f.next.lastWant())
	}
	calls := f.next.calls.Load()
	f.clk.Advance(7 * time.Second) // still within QuietTTL: from the lease
	if res := f.take(f.s, r); res.Source != bucket.SourceLease || f.next.calls.Load() != calls {
		t.Fatalf("after 7 s: %+v, want an answer from the quiet lease", res)
	}
	f.s.settle()
	if expired.Load() != 0 || f.next.calls.Load() != calls {
		t.Fatalf("expired %d before QuietTTL, %d calls, want none", expired.Load(), f.next.calls.Load()-calls)
	}
	f.clk.Advance(3 * time.Second) // the lot has expired
	r0 := refills.Load()
	if res := f.take(f.s, r); res.Source != bucket.SourceLease {
		t.Fatalf("after QuietTTL: %+v, want the lapsed check, from memory", res)
	}
	f.s.settle()
	if expired.Load() != 52 {
		t.Fatalf("expired %d tokens, want the 53 left less the lapsed check's one", expired.Load())
	}
	if n := refills.Load() - r0; n != 1 || f.next.calls.Load() != calls+1 {
		t.Fatalf("%d refills, %d calls after the lapsed check; want the lease renewed in the background", n, f.next.calls.Load()-calls)
	}
}

// A quiet lease holding more than half its batch is not renewed before it expires, however
// near its end a check comes: the key's first check after it expired is the lapsed check
// (TestQuietLeaseExpiresAtQuietTTL), so renewing early would only cost calls.
func TestQuietLeaseNotRenewedEarly(t *testing.T) {
	f := newFixture(t, quiet10s)
	r := req("quiet", 1000, 1000, 1)
	for range 11 {
		f.take(f.s, r)
		f.clk.Advance(100 * time.Millisecond)
	}
	f.s.settle()
	if f.next.lastWant() != 55 || f.s.heldFor("quiet") != 54 {
		t.Fatalf("want %d, held %d: want a quiet lease of 55, 54 held", f.next.lastWant(), f.s.heldFor("quiet"))
	}
	calls := f.next.calls.Load()
	for range 4 { // 1.9 s to 0.1 s of the lot's 10 s left
		f.clk.Advance(8*time.Second/4 - 25*time.Millisecond)
		if res := f.take(f.s, r); res.Source != bucket.SourceLease {
			t.Fatalf("near the lease's end: %+v, want an answer from the lease", res)
		}
	}
	f.s.settle()
	if got := f.next.calls.Load(); got != calls {
		t.Fatalf("%d calls near the lease's end, want none", got-calls)
	}
}

// The same demand near the limit (10/s against 20/s: 4 × N × 10 > 20 × 1s) stays exact
// after its opening lot (two tokens, within the quiet cap of 20 × 1 s / 4).
func TestQuietKeyNearLimitIsExact(t *testing.T) {
	f := newFixture(t, nil)
	r := req("near", 20, 20, 1)
	f.opens(r)
	f.s.settle()
	f.clk.Advance(100 * time.Millisecond)
	for i := 2; i < 30; i++ {
		if res := f.take(f.s, r); res.Granted != 1 || f.next.lastWant() != 1 {
			t.Fatalf("check %d: %+v want=%d, want an exact grant of 1", i, res, f.next.lastWant())
		}
		f.clk.Advance(100 * time.Millisecond)
	}
	if n := f.next.calls.Load(); n != 29 {
		t.Fatalf("calls = %d, want 29 (the opening lot's, then one per check)", n)
	}
}

func TestQuietBatch(t *testing.T) {
	one := []bucket.Limit{{Rate: 1000, Burst: 1000}}
	for _, c := range []struct {
		name             string
		limits           []bucket.Limit
		cost, crit, size int64
		peers            int
		want             int64
	}{
		// Q = 10 s, T = 1 s: quiet while 4 × N × crit ≤ R × 10 s, capped at R × 1 s / 4N.
		{"far under", one, 1, 12, 12, 1, 12},
		{"size errs low", one, 1, 100, 40, 1, 40},
		{"nothing to lease", one, 1, 10, 1, 1, 0},
		{"capped at R×T/4N", one, 1, 2000, 2000, 1, 250},
		{"at R×Q/4N", one, 1, 2500, 2500, 1, 250},
		{"over R×Q/4N", one, 1, 2501, 100, 1, 0},
		{"peers shrink the cap", one, 1, 200, 200, 3, 83},
		{"peers shrink the criterion", one, 1, 900, 900, 3, 0},
		{"slowest limit", []bucket.Limit{{Rate: 1000, Burst: 1000}, {Rate: 100, Burst: 6000}}, 1, 20, 20, 1, 20},
		{"slowest limit caps", []bucket.Limit{{Rate: 1000, Burst: 1000}, {Rate: 100, Burst: 6000}}, 1, 200, 200, 1, 25},
		{"slowest limit over", []bucket.Limit{{Rate: 1000, Burst: 1000}, {Rate: 100, Burst: 6000}}, 1, 251, 251, 1, 0},
		{"burst caps", []bucket.Limit{{Rate: 1000, Burst: 8}}, 1, 10, 10, 1, 8},
		{"slow limit: no quiet lease", []bucket.Limit{{Rate: 2, Burst: 10}}, 1, 5, 5, 1, 0},
		{"cost", one, 5, 9, 5, 1, 0},
	} {
		if got := quietBatch(c.limits, c.cost, c.crit, c.size, c.peers, 10*time.Second, time.Second); got != c.want {
			t.Errorf("%s: quietBatch = %d, want %d", c.name, got, c.want)
		}
	}
}

func TestSlowDemand(t *testing.T) {
	const s = int64(time.Second)
	for _, c := range []struct {
		name                 string
		prev, ask, start, at int64 // at: now
		crit, size           int64
		ok                   bool
	}{
		{"nothing yet", 0, 1, 0, s / 10, 10, 9, false},
		{"two checks, under a ttl", 0, 2, 0, s / 2, 20, 13, false},
		{"a ttl in", 0, 10, 0, s, 100, 50, true},
		{"half a period in", 0, 50, 0, 5 * s, 100, 83, true},
		{"a whole last period", 40, 3, 0, s, 40, 40, true},
		{"current part faster than the last", 10, 30, 0, 2 * s, 150, 100, true},
		{"the period rolled: the part is the last", 5, 30, 0, 12 * s, 30, 30, true},
		{"two periods idle: nothing", 40, 30, 0, 25 * s, 0, 0, false},
		{"one check last period", 1, 0, 0, s / 10, 1, 1, false},
	} {
		e := entry{slowPrev: c.prev, slowAsk: c.ask, slowStart: c.start}
		crit, size, ok := e.slowDemand(c.at, 10*s, s, 1)
		if crit != c.crit || size != c.size || ok != c.ok {
			t.Errorf("%s: slowDemand = %d, %d, %v; want %d, %d, %v", c.name, crit, size, ok, c.crit, c.size, c.ok)
		}
	}
}

// A key of the tail, seen every 2 s, waits on the store for its first check only: that
// call takes the opening lot (two checks' tokens, under QuietTTL), the second check is
// spent from it and, the key's demand now known, refills it in the background with the
// quiet batch, from which the third is answered.
func TestOpeningLot(t *testing.T) {
	f := newFixture(t, quiet10s)
	r := req("tail", 1000, 1000, 1)
	if res := f.take(f.s, r); res.Source != bucket.SourceMemory || f.next.lastWant() != 2 {
		t.Fatalf("first check: %+v asked %d, want a call for the opening lot of 2", res, f.next.lastWant())
	}
	for i := 1; i < 12; i++ {
		f.clk.Advance(2 * time.Second)
		fg := f.rec.n[EventCall].Load()
		if res := f.take(f.s, r); res.Granted != 1 || res.Source != bucket.SourceLease || f.rec.n[EventCall].Load() != fg {
			t.Fatalf("check %d, 2 s after the last: %+v, want granted from the lease without waiting on a call", i, res)
		}
		f.s.settle()
	}
	if n, bg := f.rec.n[EventCall].Load(), f.rec.n[EventRefill].Load(); n != 1 || bg < 1 {
		t.Fatalf("%d foreground calls and %d refills for 12 checks, want 1 and at least 1", n, bg)
	}
	if admitted, granted := int64(12), f.next.granted.Load(); granted < admitted {
		t.Fatalf("admitted %d > granted %d", admitted, granted)
	}
}

// No opening lot where the quiet cap (R × LeaseTTL / 4N) is under two checks: a slow limit
// keeps every check exact.
func TestOpeningLotSlowLimit(t *testing.T) {
	f := newFixture(t, nil)
	r := req("slow", 4, 10, 1) // cap 4 × 1 s / 4 = 1 token
	for i := range 3 {
		if res := f.take(f.s, r); res.Granted != 1 || res.Source != bucket.SourceMemory || f.next.lastWant() != 1 {
			t.Fatalf("check %d: %+v asked %d, want an exact call for 1", i, res, f.next.lastWant())
		}
		f.clk.Advance(5 * time.Second)
	}
}

// An opening lot granted in part (the bucket had one token) serves the check and does not
// pace the key: the next check asks the store, which refuses it exactly, rather than being
// refused from memory for a pace.
func TestOpeningLotPartialDoesNotPace(t *testing.T) {
	f := newFixture(t, nil)
	r := req("drained", 1000, 100, 1)
	if res, err := f.mem.Take(t.Context(), &bucket.Request{Identity: r.Identity, Limits: r.Limits, Want: 99}); err != nil || res.Granted != 99 {
		t.Fatalf("draining the bucket: %+v %v", res, err)
	}
	if res := f.take(f.s, r); res.Granted != 1 || f.next.lastWant() != 2 {
		t.Fatalf("first check: %+v asked %d, want granted 1 of an opening lot of 2", res, f.next.lastWant())
	}
	calls := f.next.calls.Load()
	if res := f.take(f.s, r); res.Granted != 0 || f.next.calls.Load() != calls+1 || f.rec.n[EventPaced].Load() != 0 {
		t.Fatalf("second check: %+v after %d calls, %d paced, want refused by the store (one call), not paced", res, f.next.calls.Load()-calls, f.rec.n[EventPaced].Load())
	}
}
