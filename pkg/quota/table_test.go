package quota

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/allot-dev/allot/pkg/testenv/poll"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

var t0 = time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)

func daily(n int64) *rules.CalendarQuota {
	return &rules.CalendarQuota{Name: "r/daily", Quota: n, Period: rules.PeriodDay, Zone: "UTC", Loc: time.UTC}
}

// countingCounter counts the batches and ops a table sends.
type countingCounter struct {
	*Memory
	batches, ops int
}

func (c *countingCounter) AddCounters(ctx context.Context, ops []bucket.CounterOp) error {
	c.batches++
	c.ops += len(ops)
	return c.Memory.AddCounters(ctx, ops)
}

func newTable(t *testing.T, c Counter, clk clock.Clock, edit ...func(*Config)) *Table {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Clock = clk
	for _, f := range edit {
		f(&cfg)
	}
	tb, err := New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tb.Close() })
	return tb
}

func reserve(t *testing.T, tb *Table, id string, q *rules.CalendarQuota, cost int64, now time.Time) Result {
	t.Helper()
	r, err := tb.Reserve(context.Background(), id, q, cost, false, now)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A check is answered from memory: the counter is called once, for the key's first
// check in the period; admitted counts reach it at the next batch, refusals never.
func TestReserveFromMemory(t *testing.T) {
	clk := clock.NewFake(t0)
	c := &countingCounter{Memory: NewMemory()}
	tb := newTable(t, c, clk)
	q := daily(10)
	for i := range 10 {
		if r := reserve(t, tb, "key:a", q, 1, clk.Now()); !r.Allowed || r.Used != int64(i+1) || r.Remaining() != int64(9-i) {
			t.Fatalf("check %d: %+v", i, r)
		}
	}
	for range 5 {
		if r := reserve(t, tb, "key:a", q, 1, clk.Now()); r.Allowed || r.Used != 10 {
			t.Fatalf("over the quota: %+v", r)
		}
	}
	if c.batches != 1 || c.ops != 1 {
		t.Fatalf("%d batches of %d ops for one key, want the first read only", c.batches, c.ops)
	}
	start := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	if got := c.Get("key:a", q.Name, start); got != 0 {
		t.Fatalf("counter %d before the batch", got)
	}
	tb.Flush(context.Background())
	if got := c.Get("key:a", q.Name, start); got != 10 {
		t.Fatalf("counter %d after the batch, want the 10 admitted (refusals not counted)", got)
	}
	// A cost that does not fit is refused whole; one that does is counted.
	if r := reserve(t, tb, "key:b", q, 11, clk.Now()); r.Allowed {
		t.Fatalf("cost 11 of 10 admitted: %+v", r)
	}
	if r := reserve(t, tb, "key:b", q, 4, clk.Now()); !r.Allowed || r.Used != 4 {
		t.Fatalf("cost 4: %+v", r)
	}
	// Cancel gives a count back (a later rule refused the check).
	tb.Cancel("key:b", q, 4, start, start.Add(24*time.Hour))
	if r, _ := tb.Peek(context.Background(), "key:b", q, 10, false, clk.Now()); !r.Allowed || r.Used != 10 {
		t.Fatalf("after cancel, a peek of 10: %+v", r)
	}
}

// Several tables (enforcers) sharing one counter learn each other's counts at each
// batch; together they admit at most the quota + what they admitted between batches.
func TestTablesShareACounter(t *testing.T) {
	clk := clock.NewFake(t0)
	m := NewMemory()
	const n, quota = 3, 100
	tbs := make([]*Table, n)
	for i := range tbs {
		tbs[i] = newTable(t, m, clk)
	}
	q := daily(quota)
	admitted := 0
	// Each enforcer sees 5 requests a flush interval (2 s): 15 requests a batch in all.
	for step := 0; step < 40; step++ {
		for _, tb := range tbs {
			for range 5 {
				if r := reserve(t, tb, "key:a", q, 1, clk.Now()); r.Allowed {
					admitted++
				}
			}
		}
		clk.Advance(2 * time.Second)
		for _, tb := range tbs {
			tb.Flush(context.Background())
		}
	}
	// The bound: enforcers × per-enforcer rate × flush = 3 × 5 = 15 a batch, twice over
	// (the batch being sent and the refresh's lag).
	bound := n * 5 * 2
	if admitted < quota || admitted > quota+bound {
		t.Fatalf("admitted %d, want in [%d, %d]", admitted, quota, quota+bound)
	}
	start := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	if got := m.Get("key:a", q.Name, start); got != int64(admitted) {
		t.Fatalf("counter %d, admitted %d", got, admitted)
	}
	t.Logf("3 enforcers, 15 requests a batch, quota %d: admitted %d (bound %d)", quota, admitted, quota+bound)
}

// Raising a quota mid-period admits at once; lowering it below the usage refuses at
// once: the limit is read at each check, the counter is usage.
func TestRaiseAndLowerMidPeriod(t *testing.T) {
	clk := clock.NewFake(t0)
	tb := newTable(t, NewMemory(), clk)
	q := daily(5)
	for range 5 {
		reserve(t, tb, "key:a", q, 1, clk.Now())
	}
	if r := reserve(t, tb, "key:a", q, 1, clk.Now()); r.Allowed {
		t.Fatal("6th of 5 admitted")
	}
	raised := daily(8)
	for i := range 3 {
		if r := reserve(t, tb, "key:a", raised, 1, clk.Now()); !r.Allowed {
			t.Fatalf("raised to 8: check %d refused: %+v", i, r)
		}
	}
	if r := reserve(t, tb, "key:a", raised, 1, clk.Now()); r.Allowed {
		t.Fatal("9th of 8 admitted")
	}
	lowered := daily(3)
	if r := reserve(t, tb, "key:a", lowered, 1, clk.Now()); r.Allowed || r.Remaining() != 0 || r.Used != 8 {
		t.Fatalf("lowered to 3 under a usage of 8: %+v", r)
	}
}

// A counter that lost its counts mid-period (a Redis restart without persistence) is
// raised back at the next batch to the last total an enforcer knew: max, not sum.
func TestCounterRestoredAfterLoss(t *testing.T) {
	clk := clock.NewFake(t0)
	m := NewMemory()
	a, b := newTable(t, m, clk), newTable(t, m, clk)
	q := daily(100)
	start, _ := q.Bounds(t0)
	for range 30 {
		reserve(t, a, "key:a", q, 1, clk.Now())
	}
	for range 20 {
		reserve(t, b, "key:a", q, 1, clk.Now())
	}
	a.Flush(context.Background())
	b.Flush(context.Background())
	a.Flush(context.Background()) // a learns b's
	if got := m.Get("key:a", q.Name, start); got != 50 {
		t.Fatalf("counter %d, want 50", got)
	}
	m.Reset() // restart: the counter is gone
	reserve(t, b, "key:a", q, 1, clk.Now())
	b.Flush(context.Background())
	a.Flush(context.Background())
	if got := m.Get("key:a", q.Name, start); got != 51 {
		t.Fatalf("counter %d after the loss, want 51 (50 known + 1), never the sum of what each knew", got)
	}
}

// After a loss, whichever enforcer sends first, the counts made during the outage are
// added on top of the last known total, not lost under it.
func TestCounterRestoredWhicheverFirst(t *testing.T) {
	clk := clock.NewFake(t0)
	m := NewMemory()
	a, b := newTable(t, m, clk), newTable(t, m, clk)
	q := daily(1000)
	start, _ := q.Bounds(t0)
	ctx := context.Background()
	for range 60 {
		reserve(t, a, "key:k", q, 1, clk.Now())
	}
	for range 40 {
		reserve(t, b, "key:k", q, 1, clk.Now())
	}
	a.Flush(ctx)
	b.Flush(ctx)
	a.Flush(ctx)
	m.Fail(errors.New("down"))
	for range 5 {
		reserve(t, b, "key:k", q, 1, clk.Now())
	}
	b.Flush(ctx) // fails
	m.Reset()
	m.Fail(nil)
	b.Flush(ctx) // b first, into an empty counter
	a.Flush(ctx)
	b.Flush(ctx)
	if got := m.Get("key:k", q.Name, start); got != 105 {
		t.Fatalf("counter %d, want 105 (100 known + 5 counted during the outage)", got)
	}
}

// While the counter fails: a fail-closed quota refuses once its key's batch failed; a
// fail-open one counts locally against the total it last knew, and the counts reach the
// counter when it answers again.
func TestOutage(t *testing.T) {
	clk := clock.NewFake(t0)
	m := NewMemory()
	tb := newTable(t, m, clk)
	q := daily(10)
	start, _ := q.Bounds(t0)
	ctx := context.Background()
	for range 4 {
		reserve(t, tb, "key:a", q, 1, clk.Now())
	}
	tb.Flush(ctx)
	m.Fail(errors.New("shard down"))
	reserve(t, tb, "key:a", q, 1, clk.Now())
	tb.Flush(ctx) // fails: kept pending
	if _, err := tb.Reserve(ctx, "key:a", q, 1, true, clk.Now()); !errors.Is(err, ErrUnsynced) || !errors.Is(err, bucket.ErrUnavailable) {
		t.Fatalf("fail-closed while unsynced: %v", err)
	}
	admitted := 0
	for range 10 {
		if r := reserve(t, tb, "key:a", q, 1, clk.Now()); r.Allowed {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("fail-open admitted %d during the outage, want 5 (10 − the 5 known)", admitted)
	}
	// A key first seen during the outage: no read waits (the counter is known down).
	if r := reserve(t, tb, "key:new", q, 1, clk.Now()); !r.Allowed || r.Synced {
		t.Fatalf("new key during the outage: %+v", r)
	}
	m.Fail(nil)
	tb.Flush(ctx)
	if got := m.Get("key:a", q.Name, start); got != 10 {
		t.Fatalf("counter %d after the outage, want 10", got)
	}
	if got := m.Get("key:new", q.Name, start); got != 1 {
		t.Fatalf("new key's counter %d, want 1", got)
	}
	if _, err := tb.Reserve(ctx, "key:a", q, 1, true, clk.Now()); err != nil {
		t.Fatalf("fail-closed after the outage: %v", err)
	}
}

// The table is bounded: a client inventing keys evicts idle entries, whose counts are
// sent first, and an idle entry is dropped at a batch.
func TestBoundedTable(t *testing.T) {
	clk := clock.NewFake(t0)
	m := NewMemory()
	tb := newTable(t, m, clk, func(c *Config) { c.MaxEntries = 64 })
	q := daily(1000)
	start, _ := q.Bounds(t0)
	for i := range 5000 {
		reserve(t, tb, fmt.Sprintf("key:%d", i), q, 1, clk.Now())
		if n := tb.Len(); n > 64 {
			t.Fatalf("table holds %d entries, more than 64", n)
		}
		if i%4 == 3 {
			// Batches keep up with the evictions: a shard keeps MaxEntries/16 = 4 orphans,
			// so a batch every 4 evictions never drops one, whenever the table's own
			// flusher (kicked at 2) runs. Every 16 lost one now and then under load.
			tb.Flush(context.Background())
		}
	}
	tb.Flush(context.Background())
	if lost := tb.Lost(); lost != 0 {
		t.Fatalf("%d counts lost although every batch was sent", lost)
	}
	sum := int64(0)
	for i := range 5000 {
		sum += m.Get(fmt.Sprintf("key:%d", i), q.Name, start)
	}
	if sum != 5000 {
		t.Fatalf("counters sum to %d, want every admitted count (5000), evicted ones included", sum)
	}
	clk.Advance(2 * time.Minute)
	tb.Flush(context.Background())
	if n := tb.Len(); n != 0 {
		t.Fatalf("%d entries after being idle past Keep", n)
	}
}

// At the period's end a key starts from zero; the old period's counts still reach their
// own counter.
func TestPeriodRollover(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 12, 4, 23, 59, 59, 0, time.UTC))
	m := NewMemory()
	tb := newTable(t, m, clk)
	q := daily(3)
	for range 3 {
		reserve(t, tb, "key:a", q, 1, clk.Now())
	}
	if r := reserve(t, tb, "key:a", q, 1, clk.Now()); r.Allowed {
		t.Fatal("4th of 3 admitted")
	}
	clk.Advance(time.Second)
	r := reserve(t, tb, "key:a", q, 1, clk.Now())
	if !r.Allowed || r.Used != 1 || !r.Start.Equal(time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("first check of the new day: %+v", r)
	}
	tb.Flush(context.Background())
	if got := m.Get("key:a", q.Name, time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)); got != 3 {
		t.Fatalf("yesterday's counter %d, want 3", got)
	}
	if got := m.Get("key:a", q.Name, r.Start); got != 1 {
		t.Fatalf("today's counter %d, want 1", got)
	}
}

type fixedView int64

func (v fixedView) Others(time.Time, string, string, time.Time) int64 { return int64(v) }

// Other regions' counts (View) come off the quota this region holds.
func TestViewOthers(t *testing.T) {
	clk := clock.NewFake(t0)
	tb := newTable(t, NewMemory(), clk, func(c *Config) { c.View = fixedView(7) })
	q := daily(10)
	admitted := 0
	for range 10 {
		if r := reserve(t, tb, "key:a", q, 1, clk.Now()); r.Allowed {
			admitted++
		}
	}
	if admitted != 3 {
		t.Fatalf("admitted %d with 7 of 10 used elsewhere", admitted)
	}
}

// The flusher sends a batch every Flush on the injected clock; Close sends the last one
// and waits.
func TestFlusherOnTheClock(t *testing.T) {
	clk := clock.NewFake(t0)
	m := NewMemory()
	cfg := DefaultConfig()
	cfg.Clock = clk
	tb, err := New(m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	q := daily(10)
	start, _ := q.Bounds(t0)
	reserve(t, tb, "key:a", q, 2, clk.Now())
	waitTimer(t, clk)
	clk.Advance(2 * time.Second)
	poll.True(t, 5*time.Second, "a batch after one flush interval", func() bool { return m.Get("key:a", q.Name, start) == 2 })
	reserve(t, tb, "key:a", q, 3, clk.Now())
	if err := tb.Close(); err != nil {
		t.Fatal(err)
	}
	if got := m.Get("key:a", q.Name, start); got != 5 {
		t.Fatalf("counter %d after Close, want 5 (the last batch sent)", got)
	}
	_ = tb.Close() // idempotent
}

// waitTimer waits (bounded) until the flusher waits on the fake clock.
func waitTimer(t *testing.T, clk *clock.Fake) {
	t.Helper()
	poll.True(t, 5*time.Second, "the flusher waiting on the clock", func() bool { return clk.Timers() > 0 })
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) { c.Flush = 0 }, "flush 0s"},
		{func(c *Config) { c.Keep = time.Second }, "keep 1s"},
		{func(c *Config) { c.MaxEntries = 1 }, "max entries 1"},
		{func(c *Config) { c.ReadTimeout = -1 }, "read timeout"},
	} {
		c := DefaultConfig()
		tc.edit(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want %q", err, tc.want)
		}
	}
}

// The counts of evicted entries waiting for a batch are bounded too: past the bound they
// are counted as lost, never kept without limit.
func TestOrphansBounded(t *testing.T) {
	clk := clock.NewFake(t0)
	m := NewMemory()
	m.Fail(errors.New("down")) // nothing is sent: everything evicted waits
	tb := newTable(t, m, clk, func(c *Config) { c.MaxEntries = 64 })
	q := daily(1000)
	for i := range 10000 {
		reserve(t, tb, fmt.Sprintf("key:%d", i), q, 1, clk.Now())
	}
	tb.flushMu.Lock() // no batch half done while counting
	defer tb.flushMu.Unlock()
	held := 0
	for i := range tb.shards {
		sh := &tb.shards[i]
		sh.mu.Lock()
		if len(sh.orphans) > 64/numShards {
			t.Errorf("shard %d holds %d orphans, more than %d", i, len(sh.orphans), 64/numShards)
		}
		for _, o := range sh.orphans {
			held += int(o.Delta)
		}
		for _, e := range sh.entries {
			held += int(e.pending + e.syncing)
		}
		sh.mu.Unlock()
	}
	if lost := tb.Lost(); lost+int64(held) != 10000 {
		t.Fatalf("lost %d + held %d, want the 10000 counts accounted for", lost, held)
	}
}

// One table never admits past the quota, however many checks race: the decision and the
// count are one step under the entry's lock.
func TestReserveConcurrent(t *testing.T) {
	clk := clock.NewFake(t0)
	tb := newTable(t, NewMemory(), clk)
	q := daily(500)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				if r, err := tb.Reserve(context.Background(), "key:a", q, 1, false, clk.Now()); err == nil && r.Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if got := admitted.Load(); got != 500 {
		t.Fatalf("admitted %d of 800 racing checks, want exactly the quota, 500", got)
	}
}

// The table's metrics: batches by result, keys held.
func TestMetrics(t *testing.T) {
	clk := clock.NewFake(t0)
	m := NewMemory()
	reg := prometheus.NewRegistry()
	tb := newTable(t, m, clk, func(c *Config) { c.Registerer = reg })
	reserve(t, tb, "key:a", daily(10), 1, clk.Now())
	tb.Flush(context.Background())
	m.Fail(errors.New("down"))
	tb.Flush(context.Background())
	want := `
# HELP allot_quota_batches_total Batches of calendar quota counts sent to the counters, by result (failed: any op of it failed).
# TYPE allot_quota_batches_total counter
allot_quota_batches_total{result="failed"} 1
allot_quota_batches_total{result="ok"} 1
# HELP allot_quota_keys Calendar quota entries (identity, quota) the enforcer holds in memory.
# TYPE allot_quota_keys gauge
allot_quota_keys 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "allot_quota_batches_total", "allot_quota_keys"); err != nil {
		t.Fatal(err)
	}
}
