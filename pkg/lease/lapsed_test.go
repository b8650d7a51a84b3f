package lease

import (
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// A key that comes back after its lease expired unspent: the check that finds it so spends
// its own cost from what expired (the lapsed check) instead of waiting on the next store,
// the rest is dropped as expired, and a refill goes in the background. Only that one check:
// the next one finds nothing held.
func TestLapsedCheck(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.BusyHits = 1 })
	r := req("k", 1000, 1000, 1)
	for range 4 { // busy: each lease twice the window's demand so far
		f.take(f.s, r)
		f.s.settle()
	}
	held := f.s.heldFor("k")
	if held < 2 {
		t.Fatalf("held %d, want a lease", held)
	}
	calls, refills := f.rec.n[EventCall].Load(), f.rec.n[EventRefill].Load()
	f.clk.Advance(time.Second) // the lease's TTL: it has expired
	res := f.take(f.s, r)
	if res.Source != bucket.SourceLease || res.Granted != 1 || f.rec.n[EventCall].Load() != calls {
		t.Fatalf("check after the TTL: %+v, %d foreground calls; want the lapsed check, from memory",
			res, f.rec.n[EventCall].Load()-calls)
	}
	f.s.settle()
	if n := f.rec.tokens[EventExpired].Load(); n != held-1 {
		t.Fatalf("expired %d tokens, want %d (all but the lapsed check's)", n, held-1)
	}
	if n := f.rec.n[EventRefill].Load() - refills; n != 1 {
		t.Fatalf("%d refills after the lapsed check, want 1 in the background", n)
	}

	// A check that needs more than what expired calls, as before.
	g := req("g", 1000, 1000, 1)
	f.take(f.s, g)
	f.s.settle()
	gh := f.s.heldFor("g")
	f.clk.Advance(time.Second)
	calls = f.rec.n[EventCall].Load()
	if res := f.take(f.s, req("g", 1000, 1000, gh+1)); res.Source != bucket.SourceMemory || f.rec.n[EventCall].Load() != calls+1 {
		t.Fatalf("a check of %d after %d expired: %+v; want a call", gh+1, gh, res)
	}

	// Limits changed while the key was away: the lease is dropped under the old limits, not
	// spent under the new ones.
	c := req("c", 1000, 1000, 1)
	f.take(f.s, c)
	f.s.settle()
	ch := f.s.heldFor("c")
	f.clk.Advance(time.Second)
	calls, changed := f.rec.n[EventCall].Load(), f.rec.tokens[EventLimitsChanged].Load()
	if res := f.take(f.s, req("c", 500, 1000, 1)); res.Source != bucket.SourceMemory || f.rec.n[EventCall].Load() != calls+1 {
		t.Fatalf("new limits after expiry: %+v; want a call", res)
	}
	if d := f.rec.tokens[EventLimitsChanged].Load() - changed; d != ch {
		t.Fatalf("%d tokens dropped for the new limits, want the %d held", d, ch)
	}
}

// keepLapsed keeps the check's cost only for a key that holds nothing else and was last
// seen neither refused, paced nor contended: those keys' next answers are the refusal
// cache's or a call's, never tokens taken long ago.
func TestKeepLapsed(t *testing.T) {
	const now = int64(10 * time.Second)
	r := &bucket.Request{Identity: "k", Limits: []bucket.Limit{{Name: "s", Rate: 100, Burst: 100}}, Want: 3, Min: 2}
	for _, c := range []struct {
		name string
		mod  func(*entry)
		d    int64
		want int64
	}{
		{"plain", func(*entry) {}, 10, 2},
		{"exactly the cost", func(*entry) {}, 2, 2},
		{"less than the cost", func(*entry) {}, 1, 0},
		{"another lot held", func(e *entry) { e.nxt, e.nxtExp = 1, now+1 }, 10, 0},
		{"contended", func(e *entry) { e.contended = true }, 10, 0},
		{"paced", func(e *entry) { e.pacedUntil = now + 1 }, 10, 0},
		{"refused", func(e *entry) { e.refusedUntil, e.refusedMin = now+1, 1 }, 10, 0},
		{"refused for more than the cost", func(e *entry) { e.refusedUntil, e.refusedMin = now+1, 3 }, 10, 2},
		{"refusal over", func(e *entry) { e.refusedUntil, e.refusedMin = now, 1 }, 10, 2},
	} {
		var e entry
		c.mod(&e)
		heldBefore := e.held()
		if got := keepLapsed(&e, r, now, c.d); got != c.want {
			t.Errorf("%s: kept %d, want %d", c.name, got, c.want)
		}
		if got := e.held() - heldBefore; got != c.want {
			t.Errorf("%s: held %d more, want %d", c.name, got, c.want)
		}
		if c.want > 0 {
			if e.expire(now) != 0 {
				t.Errorf("%s: the kept tokens expired at once", c.name)
			}
			if d := e.expire(now + 1); d != c.want {
				t.Errorf("%s: %d dropped a moment later, want the %d unspent", c.name, d, c.want)
			}
		}
	}
}
