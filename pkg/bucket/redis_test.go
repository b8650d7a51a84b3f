package bucket_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/redis/go-redis/v9"
)

func newRedis(t testing.TB, c bucket.RedisClient) *bucket.Redis {
	t.Helper()
	r, err := bucket.NewRedis(c, bucket.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestRedisAtomicityCluster: 64 goroutines over 4 separate cluster clients (4 enforcers)
// hammer one identity for ~3 s. They never get more than burst + rate × elapsed (elapsed
// from before the first call to after the last) and not materially less.
func TestRedisAtomicityCluster(t *testing.T) {
	cl := testenv.RedisCluster(t, testenv.ClusterOptions{Masters: 3})
	t.Run("alone", func(t *testing.T) { testAtomicity(t, cl, bucket.RedisOptions{}) })
	t.Run("pipeline", func(t *testing.T) { testAtomicity(t, cl, bucket.RedisOptions{Pipeline: true}) })
}

func testAtomicity(t *testing.T, cl *testenv.Cluster, opts bucket.RedisOptions) {
	const (
		clients    = 4
		goroutines = 64
		// The rate is low enough that even a loaded 2-core machine under -race offers
		// several times it, and the burst (one second of it) absorbs client stalls
		// (GC, scheduling) that would otherwise let the bucket overflow unused.
		rate     = 100.0 // a second
		burst    = 100.0
		run      = 3 * time.Second
		maxTakes = 200_000 // per goroutine: the loop's bound besides time
	)
	stores := make([]*bucket.Redis, clients)
	for i := range stores {
		st, err := bucket.NewRedis(cl.Client(), opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		stores[i] = st
		if err := stores[i].Preload(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	limits := []bucket.Limit{
		{Name: "per-second", Rate: rate, Burst: burst},
		{Name: "per-hour", Rate: 1e6 / 3600, Burst: 1e6}, // never the limiting one
	}
	id := fmt.Sprintf("atomic:%d", time.Now().UnixNano())
	var granted, attempts, failures atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(run)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := stores[g%clients]
			req := &bucket.Request{Identity: id, Limits: limits, Want: 1}
			if g%2 == 1 { // half ask for batches, partial grants allowed
				req.Want, req.Min = 3, 1
			}
			for i := 0; i < maxTakes && time.Now().Before(deadline); i++ {
				r, err := st.Take(context.Background(), req)
				attempts.Add(1)
				if err != nil {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				granted.Add(r.Granted)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if n := failures.Load(); n > 0 {
		t.Fatalf("%d takes failed, first: %v", n, firstErr.Load())
	}
	bound := burst + rate*elapsed.Seconds()
	got := float64(granted.Load())
	offered := float64(attempts.Load()) / elapsed.Seconds()
	var calls uint64
	for _, s := range stores {
		calls += s.Calls()
	}
	t.Logf("granted %d tokens in %v over %d calls (%.0f takes/s offered, %.1f× the rate); bound %.1f; %.1f%% of it; %.2f Redis calls per take",
		granted.Load(), elapsed.Round(time.Millisecond), attempts.Load(), offered, offered/rate, bound, 100*got/bound,
		float64(calls)/float64(attempts.Load()))
	if got > bound {
		t.Fatalf("granted %v tokens, more than burst + rate × elapsed = %.1f", got, bound)
	}
	if offered < 3*rate {
		t.Fatalf("offered only %.0f takes/s, not well above the rate %v: the test proves nothing", offered, rate)
	}
	if got < 0.95*bound {
		t.Fatalf("granted %v tokens, less than 95%% of %.1f", got, bound)
	}
}

// TestRedisMatchesDecide plays a random sequence of takes against Redis and checks every
// answer against bucket.Decide evaluated in Go. A granted take writes the time the script
// used into every bucket, so for grants the check is bit for bit: the stored tokens and
// every figure of the result. For refusals, nothing may change and the retry-after must
// lie between Go's answers for the times just before and just after the call.
func TestRedisMatchesDecide(t *testing.T) {
	n := testenv.Redis(t)
	c := n.Client()
	st := newRedis(t, c)
	ctx := context.Background()
	limits := []bucket.Limit{
		{Name: "fast", Rate: 200, Burst: 3},
		{Name: "odd", Rate: 137.3, Burst: 7.5},
		{Name: "slow", Rate: 70.7, Burst: 20},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	id := fmt.Sprintf("decide:%d", time.Now().UnixNano())
	var grants, refusals, expired int
	for i := 0; i < 400; i++ {
		// a random non-empty subset of the limits, in a random order
		var ls []bucket.Limit
		for _, j := range rng.Perm(len(limits)) {
			if len(ls) == 0 || rng.IntN(2) == 0 {
				ls = append(ls, limits[j])
			}
		}
		want := int64(1 + rng.IntN(3))
		min := int64(rng.IntN(int(want) + 1))
		req := &bucket.Request{Identity: id, Limits: ls, Want: want, Min: min}
		if rng.IntN(3) == 0 { // let the buckets refill a little (bounded: < 1 s in all)
			time.Sleep(time.Duration(rng.IntN(5000)) * time.Microsecond)
		}

		before := readStates(t, c, st, id, ls)
		t0 := time.Now().UnixMicro()
		res, err := st.Take(ctx, req)
		t1 := time.Now().UnixMicro()
		if err != nil {
			t.Fatal(err)
		}
		after := readStates(t, c, st, id, ls)
		t2 := time.Now().UnixMicro()

		if res.Granted == 0 {
			refusals++
			for j, l := range ls {
				expired := after[j] == (bucket.State{}) && t2 >= before[j].Last+l.FullAfterMicros(before[j].Tokens)
				if after[j] != before[j] && !expired {
					t.Fatalf("take %d: refused, but bucket %q changed from %+v to %+v", i, ls[j].Name, before[j], after[j])
				}
			}
			hi := goDecide(ls, before, t0, req)
			lo := goDecide(ls, before, t1, req)
			if lo.Granted != 0 && hi.Granted != 0 {
				t.Fatalf("take %d: Redis refused, Go grants at both ends of the call: %+v", i, hi)
			}
			ra := res.RetryAfter.Microseconds()
			if ra > hi.RetryAfterMicros || ra < lo.RetryAfterMicros {
				t.Fatalf("take %d: retry-after %d µs outside Go's [%d, %d]", i, ra, lo.RetryAfterMicros, hi.RetryAfterMicros)
			}
			continue
		}
		if slicesContainZero(after) {
			// A bucket full again before it was read back has expired: its write
			// cannot be checked, nor the script's time known.
			expired++
			continue
		}
		grants++
		now := after[0].Last
		for j := range ls {
			if after[j].Last != now {
				t.Fatalf("take %d: bucket %q written with time %d, bucket %q with %d", i, ls[j].Name, after[j].Last, ls[0].Name, now)
			}
		}
		if now < t0 || now > t1 {
			t.Logf("take %d: server time %d outside the client's [%d, %d]", i, now, t0, t1)
		}
		if !matchesGo(ls, before, after, now, req, res) {
			t.Fatalf("take %d (%+v): Redis answered %+v and left %+v; Go's Decide from %+v at %d differs",
				i, req, res, after, before, now)
		}
	}
	if grants < 50 || refusals < 50 {
		t.Fatalf("%d grants and %d refusals: the sequence does not exercise both", grants, refusals)
	}
	t.Logf("%d grants checked bit for bit (%d more expired before they could be read), %d refusals checked", grants, expired, refusals)
}

func slicesContainZero(states []bucket.State) bool {
	for _, s := range states {
		if s == (bucket.State{}) {
			return true
		}
	}
	return false
}

// goDecide is what the memory store would answer from states at now.
func goDecide(ls []bucket.Limit, states []bucket.State, now int64, req *bucket.Request) bucket.Decision {
	tok := make([]float64, len(ls))
	for j, l := range ls {
		tok[j] = l.TokensAt(states[j], now)
	}
	return bucket.Decide(ls, tok, req.Want, req.MinGrant())
}

// matchesGo: Go's Decide, from the states before, at the script's time, gives the same
// result and leaves the same tokens. A bucket that was full again by then may have been
// expired by Redis (read as full) or not (refilled to within a rounding of full): both
// readings are tried.
func matchesGo(ls []bucket.Limit, before, after []bucket.State, now int64, req *bucket.Request, res bucket.Result) bool {
	var fullAgain []int
	for j, l := range ls {
		if before[j].Last != 0 && now >= before[j].Last+l.FullAfterMicros(before[j].Tokens) {
			fullAgain = append(fullAgain, j)
		}
	}
	for mask := 0; mask < 1<<len(fullAgain); mask++ {
		st := append([]bucket.State(nil), before...)
		for k, j := range fullAgain {
			if mask&(1<<k) != 0 {
				st[j] = bucket.State{}
			}
		}
		tok := make([]float64, len(ls))
		for j, l := range ls {
			tok[j] = l.TokensAt(st[j], now)
		}
		d := bucket.Decide(ls, tok, req.Want, req.MinGrant())
		if bucket.ResultOf(d, bucket.SourceRedis) != res {
			continue
		}
		same := true
		for j := range ls {
			if tok[j] != after[j].Tokens {
				same = false
			}
		}
		if same {
			return true
		}
	}
	return false
}

// readStates reads the buckets as the script stores them: "<tokens> <last µs>".
func readStates(t *testing.T, c *redis.Client, st *bucket.Redis, id string, ls []bucket.Limit) []bucket.State {
	t.Helper()
	out := make([]bucket.State, len(ls))
	for j, l := range ls {
		v, err := c.Get(context.Background(), st.Key(id, l.Name)).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		tokS, lastS, ok := strings.Cut(v, " ")
		tok, err1 := strconv.ParseFloat(tokS, 64)
		last, err2 := strconv.ParseInt(lastS, 10, 64)
		if !ok || err1 != nil || err2 != nil {
			t.Fatalf("bucket %q holds %q", l.Name, v)
		}
		out[j] = bucket.State{Tokens: tok, Last: last}
	}
	return out
}

// TestRedisShardOf: ShardOf names the master that owns the identity's keys, without a
// round trip and without allocating; "" before the slot table is known and on one node.
func TestRedisShardOf(t *testing.T) {
	cl := testenv.RedisCluster(t, testenv.ClusterOptions{Masters: 3})
	cc := cl.Client()
	cmds := countCommands(cc)
	st := newRedis(t, cc)
	if got := st.ShardOf("key:abc"); got != "" {
		t.Fatalf("ShardOf before any call = %q, want \"\"", got)
	}
	if err := st.Preload(context.Background()); err != nil {
		t.Fatal(err)
	}
	ids := []string{"key:abc", "ip:2001:db8::/64", "a{b}c", "{x}", "}", "%7B", "org:42"}
	for i := 0; i < 200; i++ {
		ids = append(ids, fmt.Sprintf("k%d", i))
	}
	seen := map[string]bool{}
	before := cmds.Load()
	for _, id := range ids {
		got := st.ShardOf(id)
		want := cl.MasterFor(st.Key(id, "any")).Addr
		if got != want {
			t.Fatalf("ShardOf(%q) = %q; the key %q lives on %q", id, got, st.Key(id, "any"), want)
		}
		seen[got] = true
	}
	if n := cmds.Load() - before; n != 0 {
		t.Fatalf("ShardOf sent %d commands", n)
	}
	if len(seen) != 3 {
		t.Fatalf("200 identities on %d masters, want 3", len(seen))
	}
	if a := testing.AllocsPerRun(100, func() { st.ShardOf("a{b}c") }); a != 0 {
		t.Fatalf("ShardOf allocates %v times", a)
	}
	one := newRedis(t, testenv.Redis(t).Client())
	if got := one.ShardOf("key:abc"); got != "" {
		t.Fatalf("single node ShardOf = %q, want \"\"", got)
	}
}

// TestRedisUnreachable: a store whose Redis does not answer returns an error, never a
// grant.
func TestRedisUnreachable(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", DialTimeout: 100 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	st := newRedis(t, c)
	r, err := st.Take(context.Background(), &bucket.Request{Identity: "k", Limits: []bucket.Limit{{Name: "s", Rate: 1, Burst: 1}}, Want: 1})
	if err == nil || errors.Is(err, bucket.ErrInvalid) || r.Granted != 0 {
		t.Fatalf("Take on an unreachable Redis: %+v, %v; want an error that is not ErrInvalid", r, err)
	}
}

// TestRedisDeadline: with the client configured as Redis's doc says, a ctx deadline bounds
// a take on a server that stopped answering.
func TestRedisDeadline(t *testing.T) {
	n := testenv.Redis(t)
	c := redis.NewClient(&redis.Options{Addr: n.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	st := newRedis(t, c)
	req := &bucket.Request{Identity: "k", Limits: []bucket.Limit{{Name: "s", Rate: 1, Burst: 5}}, Want: 1}
	if _, err := st.Take(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	n.Pause(t)
	defer n.Unpause(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	r, err := st.Take(ctx, req)
	if el := time.Since(start); err == nil || el > time.Second {
		t.Fatalf("Take on a paused server: %+v, %v after %v; want an error within about 50ms", r, err, el)
	}
}
