package quota

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
)

// ErrUnsynced is Reserve's error for a fail-closed quota whose key's count is not known
// from the counter (its last batch or first read failed): the rule refuses.
var ErrUnsynced = fmt.Errorf("quota: count not synced with the counter: %w", bucket.ErrUnavailable)

// Limit is one calendar quota as compiled: rules.CalendarQuota (a pointer to it, which
// makes no allocation as an interface value). The table reads it at every check, so a
// quota raised or lowered takes effect at once.
type Limit interface {
	// ID names the quota ("<rule id>/<limit name>"): the counter's name.
	ID() string
	// Max is the tokens an identity may use in one period, all regions together.
	Max() int64
	// Bounds returns the start and end of the period that holds t.
	Bounds(t time.Time) (start, end time.Time)
}

// Config configures a Table. Start from DefaultConfig.
type Config struct {
	// Flush is how often the counts are added to the counters and the totals refreshed:
	// the batch interval of the over-error bound (package doc). Default 2 s; [50ms, 1m].
	Flush time.Duration
	// Keep is how long an entry no check used is still refreshed and kept; after it, with
	// nothing pending, it is dropped. Default 1 m; at least Flush.
	Keep time.Duration
	// ReadTimeout bounds a key's first read on the checking goroutine, and Timeout a
	// whole batch. Defaults 250 ms and 2 s.
	ReadTimeout time.Duration
	Timeout     time.Duration
	// MaxEntries bounds the table (default 100,000; [64, 1<<24]).
	MaxEntries int
	// Clock tells the period and drives the flusher. Default clock.Real().
	Clock clock.Clock
	// Logger receives failed batches. Default hclog.NewNullLogger().
	Logger hclog.Logger
	// View gives other regions' counts; nil is 0 (one region).
	View View
	// Registerer, if set, gets the table's metrics: allot_quota_batches_total{result}
	// (ok, failed: a batch with any op failed), allot_quota_keys (entries held) and
	// allot_quota_lost_counts_total (counts dropped, Lost). nil: none.
	Registerer prometheus.Registerer
}

// DefaultConfig returns a Config with every tunable set.
func DefaultConfig() Config {
	return Config{Flush: 2 * time.Second, Keep: time.Minute, ReadTimeout: 250 * time.Millisecond,
		Timeout: 2 * time.Second, MaxEntries: 100_000}
}

// Validate names the first bad value.
func (c *Config) Validate() error {
	switch {
	case c.Flush < 50*time.Millisecond || c.Flush > time.Minute:
		return fmt.Errorf("quota: config: flush %v, must be in [50ms, 1m]", c.Flush)
	case c.Keep < c.Flush || c.Keep > 24*time.Hour:
		return fmt.Errorf("quota: config: keep %v, must be in [flush %v, 24h]", c.Keep, c.Flush)
	case c.ReadTimeout <= 0 || c.ReadTimeout > 10*time.Second:
		return fmt.Errorf("quota: config: read timeout %v, must be in (0, 10s]", c.ReadTimeout)
	case c.Timeout <= 0 || c.Timeout > time.Minute:
		return fmt.Errorf("quota: config: timeout %v, must be in (0, 1m]", c.Timeout)
	case c.MaxEntries < 64 || c.MaxEntries > 1<<24:
		return fmt.Errorf("quota: config: max entries %d, must be in [64, %d]", c.MaxEntries, 1<<24)
	}
	return nil
}

// expireAfter is how long a counter outlives its period: late batches and the admin's
// reads of the period just ended still find it.
const expireAfter = 24 * time.Hour

const numShards = 16

// Table counts calendar quotas in memory and flushes them in batches (package doc). Safe
// for concurrent use. It owns one goroutine, the flusher; Close stops it after a last
// batch and waits. Build it with New.
type Table struct {
	cfg     Config
	counter Counter
	log     hclog.Logger
	seed    maphash.Seed
	shards  [numShards]shard
	down    atomic.Bool   // the last batch failed whole: new keys skip their first read
	lost    atomic.Int64  // counts dropped from full orphans (Lost)
	kick    chan struct{} // wakes the flusher before its time (orphans filling up)
	flushMu sync.Mutex    // one batch at a time (the flusher, Close, tests' Flush)
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
	batches [2]prometheus.Counter // ok, failed; nil without Config.Registerer
}

type shard struct {
	mu      sync.Mutex // guards entries and orphans
	entries map[entryKey]*entry
	orphans []bucket.CounterOp // counts of entries evicted or of periods ended, sent next
}

type entryKey struct{ identity, name string }

// entry is one (identity, quota) in the period [start, end).
type entry struct {
	start, end time.Time
	known      int64 // the counter's total at the last answer (this enforcer's counts in it)
	pending    int64 // admitted since, not yet sent
	syncing    int64 // sent in a batch not answered yet
	used       time.Time
	quota      int64         // the quota in force at its last check (q.Max(): all regions')
	synced     bool          // known came from the counter and the last batch succeeded
	reading    chan struct{} // non-nil while the first read is under way; closed at its end
}

// Result is a Reserve's answer: the quota this region holds now, what is used of it and
// when the period ends.
type Result struct {
	Allowed    bool
	Quota      int64 // the rule's quota − others' counts (View)
	Used       int64 // known + pending + syncing, after this check
	Start, End time.Time
	Synced     bool // the count is the counter's, not only local
}

// Remaining is what is left of the quota, never below 0.
func (r *Result) Remaining() int64 { return max(r.Quota-r.Used, 0) }

// New builds a Table over counter and starts its flusher.
func New(counter Counter, cfg Config) (*Table, error) {
	if counter == nil {
		return nil, errors.New("quota: New: nil counter")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real()
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	t := &Table{cfg: cfg, counter: counter, log: cfg.Logger.Named("quota"), seed: maphash.MakeSeed(),
		stop: make(chan struct{}), done: make(chan struct{}), kick: make(chan struct{}, 1)}
	for i := range t.shards {
		t.shards[i].entries = make(map[entryKey]*entry)
	}
	if err := t.register(cfg.Registerer); err != nil {
		return nil, err
	}
	go t.loop()
	return t, nil
}

// Close stops the flusher after one last batch (bounded by Config.Timeout) and waits for
// it. Idempotent.
func (t *Table) Close() error {
	t.once.Do(func() { close(t.stop) })
	<-t.done
	return nil
}

func (t *Table) loop() {
	defer close(t.done)
	for {
		tm := t.cfg.Clock.NewTimer(t.cfg.Flush)
		select {
		case <-t.stop:
			tm.Stop()
			ctx, cancel := context.WithTimeout(context.Background(), t.cfg.Timeout)
			t.Flush(ctx)
			cancel()
			return
		case <-tm.C():
		case <-t.kick:
			tm.Stop()
		}
		ctx, cancel := context.WithTimeout(context.Background(), t.cfg.Timeout)
		t.Flush(ctx)
		cancel()
	}
}

func (t *Table) shardOf(k entryKey) *shard {
	var h maphash.Hash
	h.SetSeed(t.seed)
	h.WriteString(k.identity)
	h.WriteByte(0)
	h.WriteString(k.name)
	return &t.shards[h.Sum64()%numShards]
}

// Reserve decides a check of cost tokens against q for identity at now, and on admission
// counts them (pending). It calls the counter only for the key's first check in a
// period on this table (one read, bounded by Config.ReadTimeout). A fail-closed quota
// whose count is not synced refuses with ErrUnsynced; a fail-open one is decided on the
// local count. The error is otherwise nil, or ctx's.
func (t *Table) Reserve(ctx context.Context, identity string, q Limit, cost int64, failClosed bool, now time.Time) (Result, error) {
	return t.decide(ctx, identity, q, cost, failClosed, now, true)
}

// Peek decides as Reserve would, counting nothing.
func (t *Table) Peek(ctx context.Context, identity string, q Limit, cost int64, failClosed bool, now time.Time) (Result, error) {
	return t.decide(ctx, identity, q, cost, failClosed, now, false)
}

func (t *Table) decide(ctx context.Context, identity string, q Limit, cost int64, failClosed bool, now time.Time, take bool) (Result, error) {
	k := entryKey{identity, q.ID()}
	limit := q.Max()
	if v := t.cfg.View; v != nil { // asked with no lock held
		start, _ := q.Bounds(now)
		limit -= max(v.Others(now, identity, k.name, start), 0)
	}
	sh := t.shardOf(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, err := t.entryLocked(ctx, sh, k, q, now)
	if err != nil {
		return Result{}, err
	}
	e.used, e.quota = now, q.Max()
	used := e.known + e.pending + e.syncing
	r := Result{Quota: limit, Start: e.start, End: e.end, Synced: e.synced, Used: used}
	switch {
	case failClosed && !e.synced:
		return r, ErrUnsynced
	case used+cost > limit:
		return r, nil
	}
	r.Allowed, r.Used = true, used+cost
	switch {
	case !take:
	case sh.entries[k] == e:
		e.pending += cost
	default:
		// Evicted while its first read was on the wire: the count goes out with the next
		// batch.
		t.orphanLocked(sh, t.op(identity, k.name, e.start, e.end, cost, e.known+cost))
	}
	return r, nil
}

// Cancel gives back cost tokens a Reserve of the period starting at start counted, for a
// check refused afterwards (refusals never count).
func (t *Table) Cancel(identity string, q Limit, cost int64, start, end time.Time) {
	k := entryKey{identity, q.ID()}
	sh := t.shardOf(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.entries[k]; e != nil && e.start.Equal(start) {
		e.pending -= cost // may go below 0 when a batch took it: then a negative add
		return
	}
	t.orphanLocked(sh, t.op(identity, q.ID(), start, end, -cost, 0))
}

// entryLocked returns k's entry for the period holding now, creating it (and reading the
// counter once, the lock released meanwhile) when there is none. sh.mu is held.
func (t *Table) entryLocked(ctx context.Context, sh *shard, k entryKey, q Limit, now time.Time) (*entry, error) {
	for {
		e := sh.entries[k]
		if e != nil && !now.Before(e.end) {
			t.retireLocked(sh, k, e) // the period ended: its counts go out, a new one starts
			e = nil
		}
		if e == nil {
			if len(sh.entries) >= t.cfg.MaxEntries/numShards {
				t.evictLocked(sh)
			}
			start, end := q.Bounds(now)
			e = &entry{start: start, end: end, used: now}
			sh.entries[k] = e
			if t.down.Load() {
				return e, nil // the counter is out: counted locally until a batch answers
			}
			e.reading = make(chan struct{})
			ch := e.reading
			sh.mu.Unlock()
			op := []bucket.CounterOp{t.op(k.identity, k.name, start, end, 0, 0)}
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.cfg.ReadTimeout)
			err := t.counter.AddCounters(rctx, op)
			cancel()
			sh.mu.Lock()
			if err == nil && op[0].Err == nil && sh.entries[k] == e {
				e.known, e.synced = op[0].Total, true
			}
			e.reading = nil
			close(ch)
			return e, nil
		}
		if ch := e.reading; ch != nil {
			sh.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				sh.mu.Lock()
				return nil, ctx.Err()
			}
			sh.mu.Lock()
			continue
		}
		return e, nil
	}
}

// retireLocked drops k's entry e, its unsent counts going out with the next batch.
func (t *Table) retireLocked(sh *shard, k entryKey, e *entry) {
	if e.pending != 0 {
		t.orphanLocked(sh, t.op(k.identity, k.name, e.start, e.end, e.pending, e.known+e.pending))
	}
	delete(sh.entries, k)
}

// orphanLocked keeps op (the counts of an entry no longer in the table) for the next
// batch. The orphans of a shard are bounded like its entries: past MaxEntries/16 the
// flusher is woken at once, and an op that finds the list full is merged into the last
// one of the same counter or, failing that, dropped and counted in Lost (under: those
// counts never reach the counter). Only a client evicting more keys with counts than the
// table holds within one flush interval gets there.
func (t *Table) orphanLocked(sh *shard, op bucket.CounterOp) {
	limit := t.cfg.MaxEntries / numShards
	if len(sh.orphans) >= limit/2 {
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
	if len(sh.orphans) < limit {
		sh.orphans = append(sh.orphans, op)
		return
	}
	if last := &sh.orphans[len(sh.orphans)-1]; last.Identity == op.Identity && last.Name == op.Name && last.Start.Equal(op.Start) {
		last.Delta += op.Delta
		last.Floor = max(last.Floor, op.Floor)
		return
	}
	t.lost.Add(op.Delta)
}

// Lost is the counts dropped because the orphans were full (orphanLocked): under.
func (t *Table) Lost() int64 { return t.lost.Load() }

// evictLocked drops the least recently used of a few entries (map order is random),
// keeping its counts for the next batch. Entries being read are skipped; one in a batch
// on the wire may go (its batch's counts, if they fail, come back as an orphan).
func (t *Table) evictLocked(sh *shard) {
	var vk entryKey
	var victim *entry
	n := 0
	for k, e := range sh.entries {
		if e.reading == nil && (victim == nil || e.used.Before(victim.used)) {
			vk, victim = k, e
		}
		if n++; n == 8 {
			break
		}
	}
	if victim != nil {
		t.retireLocked(sh, vk, victim)
	}
}

func (t *Table) op(identity, name string, start, end time.Time, delta, floor int64) bucket.CounterOp {
	return bucket.CounterOp{Identity: identity, Name: name, Start: start, ExpireAt: end.Add(expireAfter),
		Delta: delta, Floor: floor}
}

// Flush sends one batch now: every entry's pending counts, a refresh of every entry used
// within Config.Keep, the counts of entries evicted or of periods ended; and drops the
// entries idle past Keep. The flusher calls it every Config.Flush.
func (t *Table) Flush(ctx context.Context) {
	t.flushMu.Lock()
	defer t.flushMu.Unlock()
	now := t.cfg.Clock.Now()
	type ref struct {
		sh *shard
		k  entryKey
		e  *entry // nil: an orphan
	}
	var ops []bucket.CounterOp
	var refs []ref
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for _, o := range sh.orphans {
			ops = append(ops, o)
			refs = append(refs, ref{sh: sh})
		}
		clear(sh.orphans)
		sh.orphans = sh.orphans[:0]
		for k, e := range sh.entries {
			if e.reading != nil {
				continue
			}
			if !now.Before(e.end) || (now.Sub(e.used) > t.cfg.Keep && e.pending == 0) {
				t.retireLocked(sh, k, e)
				continue
			}
			// known (0 if never read) was the counter's total once, and the pending counts
			// are not in it: the counter holds at least their sum. A batch that failed
			// keeps known, so the floor still restores a counter that restarted empty.
			ops = append(ops, t.op(k.identity, k.name, e.start, e.end, e.pending, e.known+e.pending))
			refs = append(refs, ref{sh, k, e})
			e.syncing, e.pending = e.pending, 0
		}
		sh.mu.Unlock()
	}
	if len(ops) == 0 {
		return
	}
	err := t.counter.AddCounters(ctx, ops)
	t.down.Store(err != nil)
	failed := 0
	for i := range ops {
		op, r := &ops[i], refs[i]
		if op.Err == nil && err != nil {
			op.Err = err
		}
		if op.Err != nil {
			failed++
		}
		r.sh.mu.Lock()
		switch {
		case r.e == nil || r.sh.entries[r.k] != r.e:
			if op.Err != nil { // an orphan, or an entry dropped meanwhile: try again next time
				op.Err = nil
				t.orphanLocked(r.sh, *op)
			}
		case op.Err != nil:
			r.e.pending += r.e.syncing
			r.e.syncing, r.e.synced = 0, false
		default:
			r.e.known, r.e.syncing, r.e.synced = op.Total, 0, true
		}
		r.sh.mu.Unlock()
	}
	if t.batches[0] != nil {
		t.batches[min(failed, 1)].Inc()
	}
	if failed > 0 {
		t.log.Warn("quota counters not updated; counts kept for the next batch", "failed", failed, "ops", len(ops),
			"error", firstErr(ops))
	}
}

func firstErr(ops []bucket.CounterOp) error {
	for i := range ops {
		if ops[i].Err != nil {
			return ops[i].Err
		}
	}
	return nil
}

// Usage is what an admin reads of identity's use of q in the period holding now: from
// this table when it holds the key, else read from the counter (one call; creates
// nothing in the table).
func (t *Table) Usage(ctx context.Context, identity string, q Limit, now time.Time) (Result, error) {
	k := entryKey{identity, q.ID()}
	sh := t.shardOf(k)
	start, end := q.Bounds(now)
	r := Result{Quota: q.Max(), Start: start, End: end}
	if v := t.cfg.View; v != nil {
		r.Quota -= max(v.Others(now, identity, q.ID(), start), 0)
	}
	sh.mu.Lock()
	if e := sh.entries[k]; e != nil && e.start.Equal(start) && e.reading == nil {
		r.Used, r.Synced = e.known+e.pending+e.syncing, e.synced
		sh.mu.Unlock()
		return r, nil
	}
	sh.mu.Unlock()
	op := []bucket.CounterOp{t.op(identity, q.ID(), start, end, 0, 0)}
	if err := t.counter.AddCounters(ctx, op); err != nil {
		return r, err
	}
	if op[0].Err != nil {
		return r, op[0].Err
	}
	r.Used, r.Synced = op[0].Total, true
	return r, nil
}

// Len returns how many entries the table holds.
func (t *Table) Len() int {
	n := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		n += len(sh.entries)
		sh.mu.Unlock()
	}
	return n
}

// FlushInterval is Config.Flush: how soon a failed batch is tried again.
func (t *Table) FlushInterval() time.Duration { return t.cfg.Flush }

// register puts the table's metrics on reg (nothing when nil).
func (t *Table) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	b := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "allot_quota_batches_total",
		Help: "Batches of calendar quota counts sent to the counters, by result (failed: any op of it failed)."}, []string{"result"})
	keys := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "allot_quota_keys",
		Help: "Calendar quota entries (identity, quota) the enforcer holds in memory."}, func() float64 { return float64(t.Len()) })
	lost := prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "allot_quota_lost_counts_total",
		Help: "Calendar quota counts dropped because the waiting list of evicted keys was full (under)."}, func() float64 { return float64(t.Lost()) })
	for _, c := range []prometheus.Collector{b, keys, lost} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("quota: while registering metrics: %w", err)
		}
	}
	t.batches = [2]prometheus.Counter{b.WithLabelValues("ok"), b.WithLabelValues("failed")}
	return nil
}
