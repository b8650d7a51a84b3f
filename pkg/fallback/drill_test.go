package fallback_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/fallback"
	"github.com/allot-dev/allot/pkg/lease"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/allot-dev/allot/pkg/testenv/poll"
	"github.com/hashicorp/go-hclog"
	"github.com/redis/go-redis/v9"
)

// The outage drill: a real 3-master Redis Cluster (no replicas, so a paused master's slots
// stay unserved until it returns), the real stack fallback → lease → redis (and, as a
// second run, fallback → redis), a bounded paced load on keys of every shard, and one
// master paused and unpaused. Real clock; every wait is a bounded poll on a condition.

const (
	drillWorkers  = 4
	drillInterval = 2 * time.Millisecond // per worker: ≤ 2,000 checks/s in all
	drillMaxTime  = 60 * time.Second     // hard bound on the load, whatever happens
)

// The drill runs at the default settings: checks wait 5 ms, calls live ReplyTimeout
// (100 ms). On the shared 2-core test machines a healthy round trip has a p99 of 2–15 ms
// and stalls of 30–70 ms (more under -race), so many checks of healthy shards outlive their
// 5 ms wait; none of that may open a healthy shard's breaker. ALLOT_DRILL_REPLY_TIMEOUT
// sets another ReplyTimeout.
func drillReplyTimeout(t *testing.T) time.Duration {
	if v := os.Getenv("ALLOT_DRILL_REPLY_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("ALLOT_DRILL_REPLY_TIMEOUT=%q: want a positive Go duration", v)
		}
		return d
	}
	return fallback.DefaultReplyTimeout
}

func TestOutageDrill(t *testing.T) {
	c := testenv.RedisCluster(t, testenv.ClusterOptions{Masters: 3})
	t.Run("lease", func(t *testing.T) { runDrill(t, c, true) })
	t.Run("redis-only", func(t *testing.T) { runDrill(t, c, false) })
}

// drillKey is one identity the load checks.
type drillKey struct {
	req   *bucket.Request
	shard string
}

type check struct {
	start   time.Time
	lat     time.Duration
	key     int
	res     bucket.Result
	errText string
}

type event struct {
	at   time.Time
	what string // "fail" or "from->to"
}

// drillObserver records, per shard, failures and transitions with their times.
type drillObserver struct {
	fallback.NopObserver
	mu     sync.Mutex // mu guards events
	events map[string][]event
}

func (o *drillObserver) Transition(shard string, from, to fallback.State) {
	o.record(shard, from.String()+"->"+to.String())
}

func (o *drillObserver) Failure(shard string, _ error) { o.record(shard, "fail") }

func (o *drillObserver) record(shard, what string) {
	now := time.Now()
	o.mu.Lock()
	o.events[shard] = append(o.events[shard], event{now, what})
	o.mu.Unlock()
}

// first returns the time of the first event what on shard after t0, and whether there was one.
func (o *drillObserver) first(shard, what string, after time.Time) (time.Time, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, e := range o.events[shard] {
		if e.what == what && !e.at.Before(after) {
			return e.at, true
		}
	}
	return time.Time{}, false
}

// count returns how many events what happened on shard in [from, to).
func (o *drillObserver) count(shard, what string, from, to time.Time) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, e := range o.events[shard] {
		if e.what == what && !e.at.Before(from) && e.at.Before(to) {
			n++
		}
	}
	return n
}

// quietSince reports whether no transition happened at or after t.
func (o *drillObserver) quietSince(t time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, es := range o.events {
		for _, e := range es {
			if e.what != "fail" && !e.at.Before(t) {
				return false
			}
		}
	}
	return true
}

// transitions counts transitions per shard.
func (o *drillObserver) transitions() map[string]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string]int{}
	for sh, es := range o.events {
		for _, e := range es {
			if e.what != "fail" {
				out[sh]++
			}
		}
	}
	return out
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func runDrill(t *testing.T, c *testenv.Cluster, withLease bool) {
	client := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: c.Addrs(),
		// Without this go-redis ignores context deadlines and waits ReadTimeout on a
		// paused node: the fallback layer's 5 ms deadline would not reach the socket.
		ContextTimeoutEnabled: true,
		DialTimeout:           time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
		DisableIdentity: true,
	})
	t.Cleanup(func() { client.Close() })
	rs, err := bucket.NewRedis(client, bucket.RedisOptions{KeyPrefix: fmt.Sprintf("fbdrill-%v:", withLease)})
	if err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rs.Preload(pctx); err != nil {
		t.Fatal(err)
	}
	var next bucket.Store = rs
	if withLease {
		lcfg := lease.DefaultConfig()
		ls, err := lease.New(rs, lcfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ls.Close() })
		next = ls
	}
	obs := &drillObserver{events: map[string][]event{}}
	cfg := fallback.DefaultConfig()
	cfg.ReplyTimeout = drillReplyTimeout(t)
	cfg.ProbeTimeout = max(cfg.ProbeTimeout, cfg.ReplyTimeout)
	cfg.Shard = rs.ShardOf
	cfg.Peers = func() int { return 1 }
	cfg.Observer = obs
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: "fallback", Output: tWriter{t}, Level: hclog.Info})
	fs, err := fallback.New(next, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })

	// Two fail-open keys and one fail-closed key on each master.
	shards := map[string][]int{}
	var keys []drillKey
	for i := 0; len(keys) < 9 && i < 10_000; i++ {
		id := fmt.Sprintf("key-%d", i)
		sh := rs.ShardOf(id)
		if sh == "" {
			t.Fatalf("ShardOf(%q) is empty after Preload", id)
		}
		if len(shards[sh]) == 3 {
			continue
		}
		r := &bucket.Request{Identity: id, Want: 1,
			Limits:     []bucket.Limit{{Name: "per-second", Rate: 10_000, Burst: 10_000}},
			FailClosed: len(shards[sh]) == 2}
		shards[sh] = append(shards[sh], len(keys))
		keys = append(keys, drillKey{req: r, shard: sh})
	}
	if len(shards) != 3 {
		t.Fatalf("keys cover %d shards, want 3", len(shards))
	}
	paused := keys[0].shard
	var node *testenv.Node
	for _, n := range c.Nodes {
		if n.Addr == paused {
			node = n
		}
	}
	if node == nil {
		t.Fatalf("no node at %s", paused)
	}

	// The load: drillWorkers goroutines, one check per drillInterval each, round robin
	// over the keys, until stop or drillMaxTime.
	stop := make(chan struct{})
	var done atomic.Int64
	logs := make([][]check, drillWorkers)
	var wg sync.WaitGroup
	loadStart := time.Now()
	for w := 0; w < drillWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(drillInterval)
			defer tick.Stop()
			for i := w; time.Since(loadStart) < drillMaxTime; i++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				k := i % len(keys)
				start := time.Now()
				res, err := fs.Take(context.Background(), keys[k].req)
				ck := check{start: start, lat: time.Since(start), key: k, res: res}
				if err != nil && !(keys[k].req.FailClosed && errors.Is(err, bucket.ErrUnavailable)) {
					ck.errText = err.Error() // ErrUnavailable is a fail-closed key's answer on a down shard
				}
				logs[w] = append(logs[w], ck)
				done.Add(1)
			}
		}()
	}
	// A stall meter: the longest gap between 1 ms ticks, i.e. how long this process went
	// without being scheduled. Healthy shards trip only if stalls outlast Timeout several
	// times over; the figure says whether the machine did that.
	type gap struct {
		at time.Time
		d  time.Duration
	}
	var gapsMu sync.Mutex // gapsMu guards gaps
	var gaps []gap
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		last := time.Now()
		for time.Since(loadStart) < drillMaxTime {
			select {
			case <-stop:
				return
			case now := <-tick.C:
				if d := now.Sub(last); d > 10*time.Millisecond {
					gapsMu.Lock()
					gaps = append(gaps, gap{now, d})
					gapsMu.Unlock()
				}
				last = now
			}
		}
	}()
	stopped := false
	stopLoad := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer stopLoad()

	// Warm up: connections are dialled on first use, and a dial slower than the 5 ms
	// deadline may trip a breaker at start. Wait for a steady state: every breaker closed
	// and no transition for a second.
	poll.True(t, 30*time.Second, "2,000 warm-up checks", func() bool { return done.Load() >= 2000 })
	poll.True(t, 30*time.Second, "every breaker closed and quiet for 2s", func() bool {
		for _, st := range fs.States() {
			if st != fallback.Closed {
				return false
			}
		}
		return obs.quietSince(time.Now().Add(-2 * time.Second))
	})
	t.Logf("warm-up: transitions %v", obs.transitions())
	pauseAt := time.Now()
	node.Pause(t)
	isPaused := true
	defer func() {
		if isPaused {
			node.Unpause(t)
		}
	}()
	paused1 := time.Now()
	var openAt time.Time
	poll.True(t, 10*time.Second, "breaker of the paused shard open", func() bool {
		var ok bool
		openAt, ok = obs.first(paused, "closed->open", pauseAt)
		return ok
	})
	// Let one probe fail and re-open the breaker: the outage outlasts the first wait. A
	// probe answered from a lease also goes back to open, but proves nothing: wait for a
	// failed call after the calls in flight at openAt have ended (only probes reach the
	// shard then).
	poll.True(t, cfg.OpenFor+5*time.Second, "a failed probe", func() bool {
		return obs.count(paused, "fail", openAt.Add(cfg.ReplyTimeout+100*time.Millisecond), time.Now()) > 0
	})
	node.Unpause(t)
	isPaused = false
	unpauseAt := time.Now()
	var closedAt time.Time
	poll.True(t, 2*cfg.OpenFor+5*time.Second, "breaker closed after unpause", func() bool {
		var ok bool
		closedAt, ok = obs.first(paused, "half-open->closed", unpauseAt)
		return ok
	})
	after := done.Load()
	poll.True(t, 20*time.Second, "1,000 checks after recovery", func() bool { return done.Load() >= after+1000 })
	stopLoad()

	var all []check
	for _, l := range logs {
		all = append(all, l...)
	}
	t.Logf("%d checks in %v; paused %s at +%v (pause took %v), open at +%v, unpaused at +%v, closed at +%v",
		len(all), time.Since(loadStart).Round(time.Millisecond), paused, pauseAt.Sub(loadStart).Round(time.Millisecond),
		paused1.Sub(pauseAt).Round(time.Millisecond), openAt.Sub(loadStart).Round(time.Millisecond),
		unpauseAt.Sub(loadStart).Round(time.Millisecond), closedAt.Sub(loadStart).Round(time.Millisecond))

	var worst gap
	for _, g := range gaps {
		if g.d > worst.d {
			worst = g
		}
	}
	t.Logf("process stalls over 10ms: %d, longest %v at +%v", len(gaps), worst.d.Round(time.Millisecond), worst.at.Sub(loadStart).Round(time.Millisecond))

	// 1. Every check was answered.
	for _, ck := range all {
		if ck.errText != "" {
			t.Fatalf("check of %s at +%v failed: %s", keys[ck.key].req.Identity, ck.start.Sub(loadStart), ck.errText)
		}
	}
	// 2. Failures on the paused shard before its breaker opened. Docker takes a while to
	// pause (paused1 - pauseAt); calls before paused1 may still succeed and reset the count.
	before := obs.count(paused, "fail", pauseAt, openAt.Add(time.Nanosecond))
	frozen := obs.count(paused, "fail", paused1, openAt.Add(time.Nanosecond))
	t.Logf("failed calls on the paused shard before it opened: %d since Pause began, %d since it returned (TripAfter %d, %d workers)",
		before, frozen, cfg.TripAfter, drillWorkers)
	if frozen > cfg.TripAfter+drillWorkers-1 {
		t.Errorf("%d failures after the pause before the breaker opened, want at most TripAfter+workers-1 = %d", frozen, cfg.TripAfter+drillWorkers-1)
	}
	// The breaker opens on the first call the paused master leaves unanswered for
	// ReplyTimeout: within ReplyTimeout (and scheduling slack) of the pause taking effect,
	// which is somewhere in [pauseAt, paused1].
	// With leases, checks are answered from leased tokens (rightly: they were taken) until
	// the key's lease runs dry; the trip clock starts at the first check after the pause
	// that needed the shard.
	needed := openAt
	for _, ck := range all {
		if keys[ck.key].shard == paused && !ck.start.Before(paused1) && ck.start.Before(needed) &&
			ck.res.Source != bucket.SourceLease && ck.res.Source != bucket.SourceRefusalCache {
			needed = ck.start
		}
	}
	t.Logf("trip time: %v after Pause began, %v after it returned, %v after the first check that needed the shard (ReplyTimeout %v)",
		openAt.Sub(pauseAt).Round(time.Millisecond), openAt.Sub(paused1).Round(time.Millisecond),
		openAt.Sub(needed).Round(time.Millisecond), cfg.ReplyTimeout)
	// A stall of this process over ReplyTimeout/4 while the shard was silent makes the
	// Store (rightly) wait for a window without one; the drill's own stall meter says
	// whether the machine did that.
	stalled := 0
	gapsMu.Lock()
	for _, g := range gaps {
		if g.d > cfg.ReplyTimeout/4 && g.at.After(needed) && g.at.Before(openAt) {
			stalled++
		}
	}
	gapsMu.Unlock()
	if d := openAt.Sub(needed); d > cfg.ReplyTimeout+100*time.Millisecond {
		if stalled == 0 {
			t.Errorf("breaker opened %v after the first check that needed the paused shard, want within ReplyTimeout + 100ms = %v", d, cfg.ReplyTimeout+100*time.Millisecond)
		} else {
			t.Logf("breaker opened %v after the first check that needed the paused shard: %d stalls of this process over %v meanwhile", d, stalled, cfg.ReplyTimeout/4)
		}
	}
	// 3. While open, only probes reach the dead shard: after the calls in flight at openAt
	// end (within ReplyTimeout, allowed 100ms more), failures are failed probes, one per
	// wait (FirstOpenFor, doubling up to OpenFor).
	settle := openAt.Add(cfg.ReplyTimeout + 100*time.Millisecond)
	fails := obs.count(paused, "fail", settle, unpauseAt)
	probes := obs.count(paused, "half-open->open", settle, unpauseAt)
	t.Logf("while open: %d failed calls, %d failed probes", fails, probes)
	if fails > probes { // a probe answered from a lease re-opens without a failure
		t.Errorf("while open %d calls failed on the dead shard but only %d were probes", fails, probes)
	}

	// 4. Sources and latency per phase.
	type stats struct {
		lats    []time.Duration
		sources map[bucket.Source]int
	}
	phase := func(from, to time.Time, onPaused bool, failClosed *bool) stats {
		s := stats{sources: map[bucket.Source]int{}}
		for _, ck := range all {
			k := keys[ck.key]
			if ck.start.Before(from) || !ck.start.Before(to) || (k.shard == paused) != onPaused {
				continue
			}
			if failClosed != nil && k.req.FailClosed != *failClosed {
				continue
			}
			s.lats = append(s.lats, ck.lat)
			s.sources[ck.res.Source]++
		}
		slices.Sort(s.lats)
		return s
	}
	pct := func(l []time.Duration, p float64) time.Duration {
		if len(l) == 0 {
			return 0
		}
		return l[min(len(l)-1, int(float64(len(l))*p))]
	}
	report := func(name string, s stats) {
		t.Logf("%-34s n=%5d p50=%-9v p99=%-9v max=%-9v sources=%v", name, len(s.lats),
			pct(s.lats, 0.5), pct(s.lats, 0.99), pct(s.lats, 1), s.sources)
	}
	yes, no := true, false
	healthyBefore := phase(loadStart, pauseAt, false, nil)
	pausedBefore := phase(loadStart, pauseAt, true, nil)
	othersDuring := phase(pauseAt, closedAt, false, nil)
	pausedOpen := phase(settle, unpauseAt, true, &no)
	closedOpen := phase(settle, unpauseAt, true, &yes)
	pausedAfter := phase(closedAt.Add(100*time.Millisecond), time.Now(), true, nil)
	report("before: other shards", healthyBefore)
	report("before: paused shard", pausedBefore)
	report("outage: other shards", othersDuring)
	report("outage (open): paused shard", pausedOpen)
	report("outage (open): paused, fail-closed", closedOpen)
	report("after close: paused shard", pausedAfter)

	shared := func(src bucket.Source) bool {
		return src == bucket.SourceRedis || src == bucket.SourceLease || src == bucket.SourceRefusalCache
	}
	healthy := phase(loadStart, time.Now(), false, nil)
	_, local := sourceCount(healthy.sources, shared)
	t.Logf("healthy shards, whole drill: %d of %d checks (%.3f%%) answered locally", local, len(healthy.lats), 100*float64(local)/float64(max(len(healthy.lats), 1)))
	// Other shards: their breakers stay closed; a check whose reply outlives its wait is
	// answered locally by design, so allow 1% of such answers.
	for sh := range shards {
		if sh != paused {
			if n := obs.count(sh, "closed->open", pauseAt, closedAt); n > 0 {
				t.Errorf("shard %s (healthy) opened %d times during the outage", sh, n)
			}
		}
	}
	if n, bad := sourceCount(othersDuring.sources, shared); bad*100 > n {
		t.Errorf("other shards during the outage: %d of %d checks not from redis/lease", bad, n)
	}
	// While open, checks are answered locally, except a probe: it goes down to the lease
	// layer, which may answer it from tokens leased before the pause (taken from Redis, so
	// exact; the probe then proves nothing and the next check probes again). So at most
	// one lease answer per probe, and none for checks that were not probes.
	probesOpen := obs.count(paused, "open->half-open", settle, unpauseAt)
	leased := 0
	for src, n := range pausedOpen.sources {
		switch src {
		case bucket.SourceFallback:
		case bucket.SourceLease:
			leased += n
		default:
			t.Errorf("paused shard while open: %d fail-open checks from %v, want fallback", n, src)
		}
	}
	for _, ck := range all {
		k := keys[ck.key]
		if k.shard == paused && k.req.FailClosed && !ck.start.Before(settle) && ck.start.Before(unpauseAt) {
			if ck.res.Source == bucket.SourceLease {
				leased++
				continue
			}
			if ck.res.Granted != 0 || ck.res.Source != bucket.SourceFailClosed || ck.res.RetryAfter <= 0 {
				t.Errorf("fail-closed check while open: %+v, want refused fail-closed with a retry-after", ck.res)
				break
			}
		}
	}
	if leased > probesOpen {
		t.Errorf("paused shard while open: %d checks answered from leases, but only %d probes", leased, probesOpen)
	}
	if closedOpen.sources[bucket.SourceFailClosed] == 0 {
		t.Error("no fail-closed check ran while the breaker was open")
	}
	if n, bad := sourceCount(pausedAfter.sources, shared); bad*100 > n {
		t.Errorf("paused shard after recovery: %d of %d checks not from redis/lease", bad, n)
	}
	if len(pausedAfter.lats) == 0 {
		t.Error("no check on the recovered shard")
	}
	// No check waits on the dead shard but the probes (one per wait, each waiting its
	// Timeout before it is answered locally): without the slowest `probes` of them, p99
	// well under the 5 ms default deadline.
	open := pausedOpen.lats[:max(len(pausedOpen.lats)-probes, 0)]
	if p99 := pct(open, 0.99); p99 >= fallback.DefaultTimeout {
		t.Errorf("p99 of checks on the open shard (%d probes left out) %v, want below %v", probes, p99, fallback.DefaultTimeout)
	}
	recovery := closedAt.Sub(unpauseAt)
	t.Logf("breaker closed %v after unpause (OpenFor %v)", recovery.Round(time.Millisecond), cfg.OpenFor)
	if recovery > cfg.OpenFor+time.Second {
		t.Errorf("breaker closed %v after unpause, want within OpenFor + a probe (%v + 1s)", recovery, cfg.OpenFor)
	}
}

// sourceCount returns how many checks sources holds and how many of them fail ok.
func sourceCount(sources map[bucket.Source]int, ok func(bucket.Source) bool) (n, bad int) {
	for src, c := range sources {
		n += c
		if !ok(src) {
			bad += c
		}
	}
	return n, bad
}
