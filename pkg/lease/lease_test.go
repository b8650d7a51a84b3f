package lease

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

func TestBatchSize(t *testing.T) {
	one := func(rate, burst float64) []bucket.Limit {
		return []bucket.Limit{{Name: "a", Rate: rate, Burst: burst}}
	}
	two := []bucket.Limit{{Name: "s", Rate: 1000, Burst: 2000}, {Name: "m", Rate: 100, Burst: 5000}}
	for _, tc := range []struct {
		name   string
		limits []bucket.Limit
		cost   int64
		demand int64
		peers  int
		want   int64
	}{
		{"part of 100ms", one(1000, 2000), 1, 0, 3, 33},
		{"one enforcer", one(1000, 2000), 1, 0, 1, 100},
		{"quiet rate gives cost", one(10, 10), 1, 0, 3, 1},
		{"cost is the floor", one(10, 10), 5, 0, 3, 5},
		{"tightest limit", two, 1, 0, 3, 3},
		{"burst caps", one(1e6, 50), 1, 0, 1, 50},
		{"burst floor", one(1e6, 50.9), 1, 0, 1, 50},
		{"demand caps", one(1000, 2000), 1, 10, 1, 20},
		{"demand cap above rate", one(1000, 2000), 1, 500, 3, 33},
		{"demand cap below cost", one(1000, 2000), 7, 1, 1, 7},
		{"peers below 1 is 1", one(1000, 2000), 1, 0, 0, 100},
		{"max rate", one(bucket.MaxRate, bucket.MaxBurst), 1, 0, 1, 1e8},
	} {
		if got := batchSize(tc.limits, tc.cost, tc.demand, tc.peers, 100*time.Millisecond); got != tc.want {
			t.Errorf("%s: batchSize = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("DefaultConfig: %v", err)
	}
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Clock = nil }, "Clock is nil"},
		{func(c *Config) { c.LeaseTTL = 0 }, "LeaseTTL 0s"},
		{func(c *Config) { c.Window = -time.Second }, "Window -1s"},
		{func(c *Config) { c.Window = 2 * time.Second }, "Window 2s is longer than LeaseTTL 1s"},
		{func(c *Config) { c.BusyHits = 0 }, "BusyHits 0"},
		{func(c *Config) { c.MaxKeys = -5 }, "MaxKeys -5"},
		{func(c *Config) { c.Refillers = 0 }, "Refillers 0"},
		{func(c *Config) { c.RefillQueue = 0 }, "RefillQueue 0"},
		{func(c *Config) { c.RefillTimeout = 0 }, "RefillTimeout 0s"},
	} {
		c := DefaultConfig()
		tc.mod(&c)
		err := c.Validate()
		if !errors.Is(err, ErrConfig) || !contains(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want an ErrConfig naming %q", err, tc.want)
		}
		if _, err := New(bucket.NewMemory(c.Clock, 1), c); err == nil && c.Clock != nil {
			t.Errorf("New accepted %q", tc.want)
		}
	}
	if _, err := New(nil, DefaultConfig()); !errors.Is(err, ErrConfig) {
		t.Errorf("New(nil) = %v, want ErrConfig", err)
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

func TestInvalidRequest(t *testing.T) {
	f := newFixture(t, nil)
	_, err := f.s.Take(context.Background(), req("", 10, 10, 1))
	if !errors.Is(err, bucket.ErrInvalid) {
		t.Fatalf("Take(empty identity) = %v, want ErrInvalid", err)
	}
	if f.s.Len() != 0 || f.next.calls.Load() != 0 {
		t.Fatal("an invalid request touched the table or the next store")
	}
}

// A key seen fewer than BusyHits times a window, for less than a LeaseTTL, is checked
// exactly once its opening lot is spent: one call per check, asking for its cost only (the
// lot is not refilled while the key's demand is unknown).
func TestQuietKeyIsExact(t *testing.T) {
	f := newFixture(t, nil)
	f.opens(req("quiet", 1000, 1000, 1))
	f.s.settle()
	f.clk.Advance(100 * time.Millisecond)
	for i := range 8 {
		res := f.take(f.s, req("quiet", 1000, 1000, 1))
		if res.Granted != 1 || res.Source != bucket.SourceMemory {
			t.Fatalf("check %d: %+v, want granted 1 from memory", i, res)
		}
		if w := f.next.lastWant(); w != 1 {
			t.Fatalf("check %d asked for %d, want 1", i, w)
		}
		f.clk.Advance(100 * time.Millisecond) // one check a window: never busy
	}
	if n := f.next.calls.Load(); n != 9 {
		t.Fatalf("calls = %d, want 9 (the opening lot's, then one per check)", n)
	}
}

// Once busy, a key asks for a batch (Want = batch, Min = cost) and spends it from memory.
func TestBusyKeyLeases(t *testing.T) {
	f := newFixture(t, nil) // BusyHits 3, Window 100ms, one enforcer: byRate = 100
	r := req("busy", 1000, 1000, 1)
	f.opens(r)
	// Third check within the window: busy. Demand is 3 tokens, so batch = min(100, 2×3).
	res := f.take(f.s, r)
	if res.Granted != 1 || f.next.lastWant() != 6 {
		t.Fatalf("third check: %+v asked %d, want granted 1 of a batch of 6", res, f.next.lastWant())
	}
	if res = f.take(f.s, r); res.Source != bucket.SourceLease || res.Granted != 1 {
		t.Fatalf("fourth check: %+v, want 1 from the lease", res)
	}
	// Offer 1000 checks at one instant: the bucket's burst. Far fewer calls than checks,
	// and never more admitted than the bucket granted.
	admitted := int64(4)
	for range 996 {
		res := f.take(f.s, r)
		admitted += res.Granted
		f.s.settle()
	}
	if n := f.next.calls.Load(); n > 20 {
		t.Errorf("calls = %d for 1000 checks, want <= 20", n)
	}
	if g := f.next.granted.Load(); admitted > g {
		t.Fatalf("admitted %d > granted %d", admitted, g)
	}
	t.Logf("1000 checks: %d calls, %d admitted, %d granted by the bucket", f.next.calls.Load(), admitted, f.next.granted.Load())
}

// The lease is refilled in the background exactly when it falls to half a batch.
func TestRefillAtHalfEmpty(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.BusyHits = 1 })
	f.peers.Store(10) // byRate = 1000 × 0.1 / 10 = 10
	r := req("k", 1000, 1000, 1)
	// step: after the check (and any refill it started has landed), the tokens held and
	// the refills made so far. Batches grow with demand: 2, 4, 8, 10 (rate cap).
	for i, st := range []struct{ held, refills int64 }{
		{1, 0},  // miss: lease of 2, spend 1
		{4, 1},  // 1→0 <= 2/2: refill of min(10, 2×2) = 4
		{3, 1},  // 3: above 4/2
		{10, 2}, // 2 <= 4/2: refill of min(10, 2×4) = 8
		{9, 2}, {8, 2}, {7, 2}, {6, 2}, {5, 2},
		{14, 3}, // 4 <= 8/2: refill of min(10, 2×10) = 10
		{13, 3}, {12, 3}, {11, 3}, {10, 3}, {9, 3}, {8, 3}, {7, 3}, {6, 3},
		{15, 4}, // 5 <= 10/2
	} {
		res := f.take(f.s, r)
		f.s.settle()
		if res.Granted != 1 {
			t.Fatalf("check %d: %+v", i+1, res)
		}
		if h, n := f.s.heldFor("k"), f.rec.n[EventRefill].Load(); h != st.held || n != st.refills {
			t.Fatalf("check %d: held %d after %d refills, want %d after %d", i+1, h, n, st.held, st.refills)
		}
	}
	if n := f.next.calls.Load(); n != 5 {
		t.Fatalf("calls = %d, want 1 foreground + 4 refills", n)
	}
}

// Concurrent misses for one key make one call; the others wait for it.
func TestSingleFlight(t *testing.T) {
	const k = 8
	waiting := newCountdown(k - 1)
	f := newFixture(t, nil)
	b := newBlocking()
	s := f.store(b, func(c *Config) { c.BusyHits = 1 }, hooks{waiting: waiting.hit})
	r := req("hot", 1e6, 1e6, 1)

	var done sync.WaitGroup
	results := make(chan bucket.Result, k)
	for range k {
		done.Add(1)
		go func() {
			defer done.Done()
			res, err := s.Take(context.Background(), r)
			if err != nil {
				t.Error(err)
			}
			results <- res
		}()
	}
	first := <-b.calls
	<-waiting.reached // the other k-1 are parked on the one call
	if n := b.n.Load(); n != 1 {
		t.Fatalf("%d calls in flight for one key, want 1", n)
	}
	// Answer this call and any later ones with everything asked for.
	stop := make(chan struct{})
	go func() {
		b.answers <- answer{res: bucket.Result{Granted: first.Want, Source: bucket.SourceRedis}}
		for {
			select {
			case c := <-b.calls:
				b.answers <- answer{res: bucket.Result{Granted: c.Want, Source: bucket.SourceRedis}}
			case <-stop:
				return
			}
		}
	}()
	done.Wait()
	s.settle()
	close(stop)
	close(results)
	var admitted int64
	for res := range results {
		admitted += res.Granted
	}
	if admitted != k {
		t.Fatalf("admitted %d, want %d", admitted, k)
	}
	// Round two is one refill sized by the k checks' demand; nothing else calls.
	if n := b.n.Load(); n > 2 {
		t.Fatalf("%d calls for %d concurrent checks, want <= 2", n, k)
	}
}

// Waiters share the leader's error: one failing call, not k.
func TestSingleFlightSharesError(t *testing.T) {
	const k = 3
	waiting := newCountdown(k - 1)
	f := newFixture(t, nil)
	b := newBlocking()
	s := f.store(b, nil, hooks{waiting: waiting.hit})
	boom := errors.New("shard down")
	errs := make(chan error, k)
	for range k {
		go func() {
			_, err := s.Take(context.Background(), req("x", 100, 100, 1))
			errs <- err
		}()
	}
	<-b.calls
	<-waiting.reached
	b.answers <- answer{err: boom}
	for range k {
		if err := <-errs; !errors.Is(err, boom) {
			t.Fatalf("Take = %v, want %v", err, boom)
		}
	}
	if n := b.n.Load(); n != 1 {
		t.Fatalf("calls = %d, want 1", n)
	}
}

// A waiter whose context ends stops waiting; the call goes on for the others.
func TestWaiterContext(t *testing.T) {
	waiting := newCountdown(1)
	f := newFixture(t, nil)
	b := newBlocking()
	s := f.store(b, nil, hooks{waiting: waiting.hit})
	lead := make(chan error, 1)
	go func() {
		_, err := s.Take(context.Background(), req("x", 100, 100, 1))
		lead <- err
	}()
	<-b.calls
	ctx, cancel := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() {
		_, err := s.Take(ctx, req("x", 100, 100, 1))
		waited <- err
	}()
	<-waiting.reached
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Fatalf("waiter: %v, want context.Canceled", err)
	}
	b.answers <- answer{res: bucket.Result{Granted: 1}}
	if err := <-lead; err != nil {
		t.Fatal(err)
	}
}

// With SyncRefill the refill runs inside the Take that made it due: when Take returns the
// refill has landed, with no goroutine and nothing to wait for. The steps are those of
// TestRefillAtHalfEmpty.
func TestSyncRefill(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.BusyHits = 1; c.SyncRefill = true })
	f.peers.Store(10)
	r := req("k", 1000, 1000, 1)
	for i, st := range []struct{ held, refills int64 }{
		{1, 0}, {4, 1}, {3, 1}, {10, 2}, {9, 2}, {8, 2}, {7, 2}, {6, 2}, {5, 2},
		{14, 3}, {13, 3}, {12, 3}, {11, 3}, {10, 3}, {9, 3}, {8, 3}, {7, 3}, {6, 3}, {15, 4},
	} {
		res := f.take(f.s, r)
		if res.Granted != 1 || res.Source != bucket.SourceLease && i > 0 {
			t.Fatalf("check %d: %+v", i+1, res)
		}
		if h, n := f.s.heldFor("k"), f.rec.n[EventRefill].Load(); h != st.held || n != st.refills {
			t.Fatalf("check %d: held %d after %d refills, want %d after %d (refill not synchronous?)", i+1, h, n, st.held, st.refills)
		}
	}
	if n := f.next.calls.Load(); n != 5 {
		t.Fatalf("calls = %d, want 1 foreground + 4 refills", n)
	}
	f.s.wg.Wait() // no refiller was started: returns at once
}

// TakeCached (pkg/fallback's cache path) runs a refill it makes due the same way, after it
// released the key's lock.
func TestSyncRefillTakeCached(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.BusyHits = 1; c.SyncRefill = true })
	f.peers.Store(10)
	r := req("k", 1000, 1000, 1)
	f.take(f.s, r) // miss: lease of 2, spend 1
	res, ok := f.s.TakeCached(r)
	if !ok || res.Granted != 1 || res.Source != bucket.SourceLease {
		t.Fatalf("TakeCached = %+v, %v", res, ok)
	}
	// 1 → 0 <= 2/2: the refill of 4 has landed when TakeCached returns.
	if h, n := f.s.heldFor("k"), f.rec.n[EventRefill].Load(); h != 4 || n != 1 {
		t.Fatalf("held %d after %d refills, want 4 after 1", h, n)
	}
}

// Each foreground call is told to the Observer with why its check waited: a key new here,
// one whose leased tokens expired, one whose lease ran out, or one not leased for.
func TestCallReasons(t *testing.T) {
	f := newFixture(t, nil) // LeaseTTL 1s, QuietTTL 2m, BusyHits 3 in a 100ms window
	var seen [EventEvicted + 1]int64
	want := func(step string, ev Event) {
		t.Helper()
		f.s.settle()
		for e := EventCallNew; e <= EventCallExact; e++ {
			n, w := f.rec.n[e].Load(), int64(0)
			if e == ev {
				w = 1
			}
			if d := n - seen[e]; d != w {
				t.Fatalf("%s: %d %v events, want %d", step, d, e, w)
			}
			seen[e] = n
		}
		if calls, why := f.rec.n[EventCall].Load(), seen[EventCallNew]+seen[EventCallExpired]+seen[EventCallSpent]+seen[EventCallExact]; calls != why {
			t.Fatalf("%s: %d calls, %d reasons", step, calls, why)
		}
	}
	slow := req("slow", 4, 10, 1) // no opening lot: its cap is one token
	f.take(f.s, slow)
	want("a slow key's first check", EventCallNew)
	f.take(f.s, slow)
	want("its second", EventCallExact)

	r := req("key", 1000, 1000, 1)
	f.opens(r)
	want("a key's opening lot", EventCallNew)
	f.take(f.s, r) // the third check in the window: busy, its lot spent
	want("the lot spent", EventCallSpent)
	f.clk.Advance(3 * time.Minute) // every lot has expired
	f.take(f.s, r)
	want("the lapsed check, from what expired", EventEvicted) // none of the four: no call
	f.take(f.s, r)
	want("after its tokens expired", EventCallExpired)
}
