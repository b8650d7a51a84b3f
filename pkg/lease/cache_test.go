package lease

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// storeFunc adapts a function to bucket.Store.
type storeFunc func(ctx context.Context, req *bucket.Request) (bucket.Result, error)

func (f storeFunc) Take(ctx context.Context, req *bucket.Request) (bucket.Result, error) {
	return f(ctx, req)
}

// script answers call i (from 1) with answers[i-1], repeating the last one.
func script(answers ...func(*bucket.Request) (bucket.Result, error)) (bucket.Store, *atomic.Int64) {
	var n atomic.Int64
	return storeFunc(func(_ context.Context, r *bucket.Request) (bucket.Result, error) {
		i := min(int(n.Add(1)), len(answers))
		return answers[i-1](r)
	}), &n
}

func grantAll(r *bucket.Request) (bucket.Result, error) {
	return bucket.Result{Granted: r.Want, Remaining: 1000, Source: bucket.SourceRedis}, nil
}

func refuse(after time.Duration) func(*bucket.Request) (bucket.Result, error) {
	return func(*bucket.Request) (bucket.Result, error) {
		return bucket.Result{RetryAfter: after, Reset: time.Second, Source: bucket.SourceRedis}, nil
	}
}

func fail(err error) func(*bucket.Request) (bucket.Result, error) {
	return func(*bucket.Request) (bucket.Result, error) { return bucket.Result{}, err }
}

// Leased tokens expire LeaseTTL after the call that took them was sent; they are dropped,
// never revived: a check that needs more than the expired lot held calls again (one that
// needs no more is the lapsed check: TestLapsedCheck).
func TestLeaseExpires(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.BusyHits = 1 })
	r := req("k", 1000, 1000, 1)
	f.take(f.s, r) // lease of 2, 1 held
	if h := f.s.heldFor("k"); h != 1 {
		t.Fatalf("held %d, want 1", h)
	}
	f.clk.Advance(time.Second - time.Nanosecond)
	if h := f.s.heldFor("k"); h != 1 {
		t.Fatalf("held %d just before the TTL, want 1", h)
	}
	f.clk.Advance(time.Nanosecond)
	calls := f.next.calls.Load()
	res := f.take(f.s, req("k", 1000, 1000, 2))
	if res.Source != bucket.SourceMemory || f.next.calls.Load() != calls+1 {
		t.Fatalf("check of 2 at the TTL: %+v, calls %d→%d; want a call", res, calls, f.next.calls.Load())
	}
	if n := f.rec.tokens[EventExpired].Load(); n != 1 {
		t.Fatalf("expired tokens = %d, want 1", n)
	}
}

// Two lots: the older expires on its own time, the newer lives on.
func TestLotsExpireSeparately(t *testing.T) {
	var e entry
	e.add(5, 100)
	e.add(7, 150)
	if e.held() != 12 {
		t.Fatalf("held %d", e.held())
	}
	e.spend(3) // from the older lot
	if e.cur != 2 || e.nxt != 7 {
		t.Fatalf("cur %d nxt %d, want 2 7", e.cur, e.nxt)
	}
	if d := e.expire(100); d != 2 || e.held() != 7 || e.curExp != 150 {
		t.Fatalf("expire(100) dropped %d, held %d exp %d; want 2, 7, 150", d, e.held(), e.curExp)
	}
	e.add(1, 200)
	e.add(1, 300) // three lots: the two older merge under the earlier expiry
	if e.cur != 8 || e.curExp != 150 || e.nxt != 1 || e.nxtExp != 300 {
		t.Fatalf("after merge: %d@%d %d@%d, want 8@150 1@300", e.cur, e.curExp, e.nxt, e.nxtExp)
	}
	if d := e.expire(150); d != 8 || e.held() != 1 {
		t.Fatalf("expire(150) dropped %d, held %d; want 8, 1", d, e.held())
	}
}

// After "refused, retry in T" the key is refused from memory until T, with no call.
func TestRefusalCache(t *testing.T) {
	f := newFixture(t, nil)
	next, calls := script(refuse(50 * time.Millisecond))
	s := f.store(next, nil, hooks{})
	r := req("k", 10, 10, 2)
	res := f.take(s, r)
	if res.Granted != 0 || res.Source != bucket.SourceRedis || calls.Load() != 1 {
		t.Fatalf("first check: %+v, calls %d", res, calls.Load())
	}
	f.clk.Advance(10 * time.Millisecond)
	res = f.take(s, r)
	if res.Source != bucket.SourceRefusalCache || res.RetryAfter != 40*time.Millisecond || res.Granted != 0 {
		t.Fatalf("cached: %+v, want refusal-cache with 40ms left", res)
	}
	f.clk.Advance(39 * time.Millisecond)
	if res = f.take(s, r); res.Source != bucket.SourceRefusalCache || res.RetryAfter != time.Millisecond {
		t.Fatalf("1ms before T: %+v", res)
	}
	f.clk.Advance(time.Millisecond)
	if res = f.take(s, r); res.Source != bucket.SourceRedis || calls.Load() != 2 {
		t.Fatalf("at T: %+v calls %d, want a call", res, calls.Load())
	}
	// Refused again for cost 2; a cheaper check may fit where that did not: it is asked for.
	if res = f.take(s, req("k", 10, 10, 1)); res.Source != bucket.SourceRedis || calls.Load() != 3 {
		t.Fatalf("cheaper check: %+v calls %d, want a call", res, calls.Load())
	}
	if n := f.rec.n[EventRefusalHit].Load(); n != 2 {
		t.Fatalf("refusal hits %d, want 2", n)
	}
}

// Leased tokens are spent before the refusal cache answers.
func TestRefusalCacheSpendsLeaseFirst(t *testing.T) {
	f := newFixture(t, nil)
	next, calls := script(grantAll, grantAll, refuse(500*time.Millisecond))
	s := f.store(next, func(c *Config) { c.BusyHits = 1 }, hooks{})
	r := req("k", 1000, 1000, 1)
	want := []bucket.Source{
		bucket.SourceRedis, // lease of 2, 1 held
		bucket.SourceLease, // 0 held: refill of 4 (call 2)
		bucket.SourceLease, // 3
		bucket.SourceLease, // 2: refill refused, retry in 500ms (call 3)
		bucket.SourceLease, // 1
		bucket.SourceLease, // 0: no refill while refused
		bucket.SourceRefusalCache,
		bucket.SourceRefusalCache,
	}
	for i, src := range want {
		res := f.take(s, r)
		s.settle()
		if res.Source != src {
			t.Fatalf("check %d: %+v, want source %v", i+1, res, src)
		}
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("calls = %d, want 3", n)
	}
	f.clk.Advance(500 * time.Millisecond)
	f.take(s, r)
	if n := calls.Load(); n != 4 {
		t.Fatalf("calls = %d after the retry time, want 4", n)
	}
}

// A grant that leaves the bucket empty primes the refusal cache: the bucket provably cannot
// give a token before (about) one token's time, so nobody asks before then.
func TestRefusalCacheAfterEmptyingGrant(t *testing.T) {
	f := newFixture(t, nil)
	r := req("k", 10, 1, 1) // one token every 100ms
	if res := f.take(f.s, r); res.Granted != 1 || res.Source != bucket.SourceMemory {
		t.Fatalf("first: %+v", res)
	}
	res := f.take(f.s, r)
	if res.Source != bucket.SourceRefusalCache || res.RetryAfter != 99*time.Millisecond {
		t.Fatalf("second: %+v, want refused from the cache for 99ms", res)
	}
	f.clk.Advance(99 * time.Millisecond)
	if res = f.take(f.s, r); res.Source != bucket.SourceMemory || res.Granted != 0 {
		t.Fatalf("at 99ms: %+v, want a call the store refuses", res)
	}
	// The store rounds its retry-after up to the µs (here 1.001ms for 0.01 token at 10/s,
	// float rounding): the cache keeps to what it was told.
	f.clk.Advance(time.Millisecond + time.Microsecond)
	if res = f.take(f.s, r); res.Granted != 1 {
		t.Fatalf("at 100ms: %+v, want granted", res)
	}
	if n := f.next.calls.Load(); n != 3 {
		t.Fatalf("calls = %d, want 3", n)
	}
}

// A request with other limits (new rule set, new share) drops the lease and the refusal
// cache taken under the old ones.
func TestLimitChangeDropsLease(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.BusyHits = 1 })
	old := req("k", 1000, 1000, 1)
	f.take(f.s, old)
	f.take(f.s, old)
	f.s.settle()
	if h := f.s.heldFor("k"); h != 4 {
		t.Fatalf("held %d, want 4", h)
	}
	calls := f.next.calls.Load()
	res := f.take(f.s, req("k", 500, 1000, 1))
	if res.Source != bucket.SourceMemory || f.next.calls.Load() != calls+1 {
		t.Fatalf("new limits: %+v, want a call", res)
	}
	if n := f.rec.tokens[EventLimitsChanged].Load(); n != 4 {
		t.Fatalf("dropped %d tokens, want 4", n)
	}
	// Same rates, other name: other limits too.
	renamed := req("k", 500, 1000, 1)
	renamed.Limits[0].Name = "other"
	f.take(f.s, renamed)
	if n := f.rec.n[EventLimitsChanged].Load(); n < 2 {
		t.Fatalf("a renamed limit kept the lease")
	}
}

// A refusal cached under old limits does not refuse a request under new ones.
func TestLimitChangeDropsRefusal(t *testing.T) {
	f := newFixture(t, nil)
	next, calls := script(refuse(time.Second), grantAll)
	s := f.store(next, nil, hooks{})
	f.take(s, req("k", 10, 10, 1))
	if res := f.take(s, req("k", 20, 10, 1)); res.Granted != 1 || calls.Load() != 2 {
		t.Fatalf("new limits: %+v, calls %d; want granted by a call", res, calls.Load())
	}
}

// Clients inventing keys cannot grow the table past MaxKeys.
func TestTableBound(t *testing.T) {
	f := newFixture(t, nil)
	next, _ := script(grantAll)
	s := f.store(next, func(c *Config) { c.MaxKeys = 1000 }, hooks{})
	if s.Cap() > 1000 {
		t.Fatalf("Cap = %d > MaxKeys", s.Cap())
	}
	r := req("", 10, 10, 1)
	for i := range 100_000 {
		r.Identity = "invented:" + strconv.Itoa(i)
		f.take(s, r)
		if i%10_000 == 0 && s.Len() > 1000 {
			t.Fatalf("after %d keys: Len = %d > 1000", i+1, s.Len())
		}
	}
	if n := s.Len(); n > 1000 || n < 900 {
		t.Fatalf("Len = %d, want in [900, 1000]", n)
	}
	if n := f.rec.n[EventEvicted].Load(); n != 100_000-int64(s.Len()) {
		t.Fatalf("evicted %d, want %d", n, 100_000-s.Len())
	}
	// The most recently used keys survive; the oldest are gone.
	sh := s.shardOf("invented:99999")
	if sh.m["invented:99999"] == nil || s.shardOf("invented:0").m["invented:0"] != nil {
		t.Fatal("eviction is not least-recently-used")
	}
}

// A busy key's entry survives a flood of invented keys as long as it is used.
func TestTableKeepsActiveKey(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.MaxKeys = 64; c.BusyHits = 1 })
	hot := req("hot", 1e6, 1e6, 1)
	r := req("", 10, 10, 1)
	for i := range 10_000 {
		r.Identity = "invented:" + strconv.Itoa(i)
		f.take(f.s, r)
		f.take(f.s, hot)
	}
	if n := f.rec.tokens[EventEvicted].Load(); n != 0 {
		t.Fatalf("evicted %d leased tokens of the active key", n)
	}
}

// A failed background refill is told to nobody; the check that finds the lease empty calls
// the next store itself and sees the error.
func TestRefillErrorSurfacesOnForegroundMiss(t *testing.T) {
	f := newFixture(t, nil)
	boom := errors.New("shard down")
	next, calls := script(grantAll, fail(boom))
	s := f.store(next, func(c *Config) { c.BusyHits = 1 }, hooks{})
	r := req("k", 1000, 1000, 1)
	f.take(s, r) // lease 2, hold 1
	f.take(s, r) // spend the last: the refill fails in the background
	s.settle()
	if f.rec.n[EventRefillError].Load() != 1 || calls.Load() != 2 {
		t.Fatalf("refill errors %d, calls %d", f.rec.n[EventRefillError].Load(), calls.Load())
	}
	if _, err := s.Take(context.Background(), r); !errors.Is(err, boom) {
		t.Fatalf("foreground miss: %v, want %v", err, boom)
	}
}

// Close cancels a refill in flight, waits for it, and is idempotent; Take then fails.
func TestCloseWaits(t *testing.T) {
	f := newFixture(t, nil)
	b := newBlocking()
	var returned atomic.Bool
	next := storeFunc(func(ctx context.Context, r *bucket.Request) (bucket.Result, error) {
		res, err := b.Take(ctx, r)
		returned.Store(true)
		return res, err
	})
	s := f.store(next, func(c *Config) { c.BusyHits = 1; c.RefillTimeout = time.Hour }, hooks{})
	r := req("k", 1000, 1000, 1)
	go func() { b.answers <- answer{res: bucket.Result{Granted: (<-b.calls).Want}} }()
	f.take(s, r) // lease 2, hold 1
	f.take(s, r) // the refill goes out and blocks
	<-b.calls
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if !returned.Load() {
		t.Fatal("Close returned while a refill was still in the next store")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := s.Take(context.Background(), r); !errors.Is(err, ErrClosed) {
		t.Fatalf("Take after Close: %v, want ErrClosed", err)
	}
}

// The leased fast path allocates nothing.
func TestFastPathAllocs(t *testing.T) {
	f := newFixture(t, nil)
	r := req("k", 1e6, 1e6, 1)
	f.take(f.s, r)
	sh := f.s.shardOf("k")
	sh.mu.Lock()
	e := sh.m["k"]
	e.cur, e.curExp, e.batch = 1<<40, int64(time.Hour), 2
	sh.mu.Unlock()
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		if res, _ := f.s.Take(ctx, r); res.Source != bucket.SourceLease {
			t.Fatalf("not leased: %+v", res)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocs per leased check, want 0", allocs)
	}
}

// A quiet key's check — a call to the next store every time, the lease holding nothing
// for it — allocates nothing either: a call that landed unwaited for leaves its flight
// to the shard's next call.
func TestQuietCallAllocs(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.Observer = nil })
	reqs := make([]*bucket.Request, 1000)
	for i := range reqs {
		reqs[i] = req("key:"+strconv.Itoa(i), 1, 1e6, 1)
		f.take(f.s, reqs[i])
	}
	ctx := context.Background()
	i := 0
	allocs := testing.AllocsPerRun(len(reqs), func() {
		if res, err := f.s.Take(ctx, reqs[i%len(reqs)]); err != nil || res.Source == bucket.SourceLease {
			t.Fatalf("not a call: %+v %v", res, err)
		}
		i++
	})
	if allocs != 0 {
		t.Fatalf("%v allocs per quiet check, want 0", allocs)
	}
}

func TestPace(t *testing.T) {
	one := []bucket.Limit{{Name: "s", Rate: 1000, Burst: 1000}}
	two := []bucket.Limit{{Name: "s", Rate: 1000, Burst: 1000}, {Name: "m", Rate: 100, Burst: 6000}}
	w := 100 * time.Millisecond
	for _, tc := range []struct {
		limits []bucket.Limit
		batch  int64
		peers  int
		want   time.Duration
	}{
		{one, 33, 3, 49500 * time.Microsecond}, // ≈ Window/2 for a rate-sized batch
		{one, 100, 1, 50 * time.Millisecond},
		{one, 10, 3, 15 * time.Millisecond}, // smaller batch (demand, burst): shorter pace
		{two, 3, 3, 45 * time.Millisecond},  // the slowest limit sets it
		{one, 1000, 3, w},                   // capped at Window
	} {
		if got := time.Duration(pace(tc.limits, tc.batch, tc.peers, w)); got != tc.want {
			t.Errorf("pace(batch %d, peers %d) = %v, want %v", tc.batch, tc.peers, got, tc.want)
		}
	}
}

// contendedFixture is a Store, 3 peers, whose next store grants every call half what it
// asks, with calls counted.
func contendedFixture(t *testing.T) (*fixture, *Store, *atomic.Int64) {
	f := newFixture(t, nil)
	f.peers.Store(3)
	partial := func(r *bucket.Request) (bucket.Result, error) {
		return bucket.Result{Granted: r.Want / 2, Source: bucket.SourceRedis}, nil
	}
	next, calls := script(partial)
	return f, f.store(next, func(c *Config) { c.BusyHits = 1; c.Window = time.Second; c.LeaseTTL = 2 * time.Second }, hooks{}), calls
}

// A lease call the bucket could not fill marks the key contended: this enforcer makes no
// further call for it until the pace has passed, and checks that find the lease empty
// meanwhile are refused from memory.
func TestContendedKeyIsPaced(t *testing.T) {
	f, s, calls := contendedFixture(t)
	r := req("k", 1000, 1000, 1)
	// Demand 1 → batch 2 → granted 1: spent by this check.
	if res := f.take(s, r); res.Granted != 1 || calls.Load() != 1 {
		t.Fatalf("first: %+v calls %d", res, calls.Load())
	}
	// pace = 3 × 2 / (2 × 1000/s) = 3ms.
	res := f.take(s, r)
	if res.Source != bucket.SourceRefusalCache || res.RetryAfter != 3*time.Millisecond || calls.Load() != 1 {
		t.Fatalf("paced: %+v calls %d, want refused from memory for 3ms", res, calls.Load())
	}
	if f.rec.n[EventPaced].Load() != 1 {
		t.Fatalf("paced events %d, want 1", f.rec.n[EventPaced].Load())
	}
	// The pace is over and a check was refused meanwhile: the key is still over-offered, so
	// its next call goes in the background and the check that found the lease empty is
	// refused from memory rather than waiting on the store.
	f.clk.Advance(3 * time.Millisecond)
	if res := f.take(s, r); res.Source != bucket.SourceRefusalCache || res.RetryAfter != refillWait {
		t.Fatalf("after the pace: %+v, want refused from memory while the refill is in flight", res)
	}
	s.settle()
	if calls.Load() != 2 || f.rec.n[EventRefill].Load() != 1 {
		t.Fatalf("calls %d, refills %d, want one background call", calls.Load(), f.rec.n[EventRefill].Load())
	}
	// It was granted half again: contended, paced anew; what it got is spent first.
	if res := f.take(s, r); res.Source != bucket.SourceLease || res.Granted != 1 {
		t.Fatalf("after the refill: %+v, want served from the lease", res)
	}
}

// A client that waits out the pace (no check refused by pacing since the last call) is
// not refused for a background refill: its check calls in the foreground, as a client
// retrying after its Retry-After expects.
func TestContendedKeyAfterAQuietPace(t *testing.T) {
	f, s, calls := contendedFixture(t)
	r := req("k", 1000, 1000, 1)
	f.take(s, r) // batch 2, granted 1, spent: paced for 3ms
	f.clk.Advance(3 * time.Millisecond)
	if res := f.take(s, r); res.Granted != 1 || res.Source == bucket.SourceRefusalCache || calls.Load() != 2 {
		t.Fatalf("after a quiet pace: %+v calls %d, want a foreground call granting 1", res, calls.Load())
	}
}

// TestTableRecencyBound holds the table to its stated order (table.go): in a shard of
// capacity C, an entry used is kept while fewer than 3/4 C other keys are inserted after
// it, and is evicted after C of them, as in exact LRU.
func TestTableRecencyBound(t *testing.T) {
	const c = 16 // MaxKeys 16: one shard of 16
	for j := 0; j <= c; j++ {
		f := newFixture(t, nil)
		next, _ := script(grantAll)
		s := f.store(next, func(cfg *Config) { cfg.MaxKeys = c }, hooks{})
		if len(s.shards) != 1 || s.perShard != c {
			t.Fatalf("%d shards of %d, want 1 of %d", len(s.shards), s.perShard, c)
		}
		r := req("", 10, 10, 1)
		for i := range c { // a full shard, "k" among the oldest
			r.Identity = "fill:" + strconv.Itoa(i)
			f.take(s, r)
		}
		k := req("k", 10, 10, 1)
		f.take(s, k) // evicts fill:0
		for i := range 2 * c {
			r.Identity = "fill:" + strconv.Itoa(i%4+1) // recent hits, which may or may not move
			f.take(s, r)
			f.take(s, k) // k is used again and again ...
		}
		for i := range j { // ... then j keys it has never seen
			r.Identity = "new:" + strconv.Itoa(i)
			f.take(s, r)
		}
		_, kept := s.shards[0].m["k"]
		switch {
		case j < c*3/4 && !kept:
			t.Fatalf("k evicted after %d new keys, fewer than 3/4 of %d", j, c)
		case j >= c && kept:
			t.Fatalf("k kept after %d new keys in a shard of %d", j, c)
		}
	}
}

// Entries given the same limits share one slice (the collector marks one object, not one
// per key); a caller's buffer is copied, never kept, and a set already handed out is never
// written when the limits change.
func TestLimitsShared(t *testing.T) {
	f := newFixture(t, nil)
	limitsOf := func(key string) []bucket.Limit {
		sh := f.s.shardOf(key)
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return sh.m[key].limits
	}
	// Two keys of one shard, asked with limits from one reused buffer, as the enforcer's
	// rescaling does.
	buf := []bucket.Limit{{Name: "s", Rate: 100, Burst: 100}}
	a := "k0"
	b := ""
	for i := 1; b == ""; i++ {
		if k := "k" + strconv.Itoa(i); f.s.shardOf(k) == f.s.shardOf(a) {
			b = k
		}
	}
	f.take(f.s, &bucket.Request{Identity: a, Limits: buf, Want: 1})
	f.take(f.s, &bucket.Request{Identity: b, Limits: buf, Want: 1})
	la, lb := limitsOf(a), limitsOf(b)
	if &la[0] != &lb[0] {
		t.Fatalf("two keys with the same limits hold two slices")
	}
	if &la[0] == &buf[0] {
		t.Fatalf("the entry kept the caller's buffer")
	}
	buf[0].Rate = 50 // the caller reuses its buffer for other limits
	if la[0].Rate != 100 {
		t.Fatalf("the caller's write reached the entry: rate %v", la[0].Rate)
	}
	f.take(f.s, &bucket.Request{Identity: a, Limits: buf, Want: 1})
	if got := limitsOf(a); got[0].Rate != 50 || la[0].Rate != 100 || limitsOf(b)[0].Rate != 100 {
		t.Fatalf("after a change: a has %v, the old set %v, b %v", got, la, limitsOf(b))
	}
}
