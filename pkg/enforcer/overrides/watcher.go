package overrides

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/etcdwatch"
	"github.com/allot-dev/allot/pkg/routine"
	"github.com/hashicorp/go-hclog"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrClosed is returned by Start and Load after Close.
var ErrClosed = errors.New("shares: watcher closed")

// WatcherConfig configures a Watcher. Start from DefaultWatcherConfig.
type WatcherConfig struct {
	// Prefix is where the balancer publishes (shareset layout). Default
	// contract.SharesPrefix; must not be empty.
	Prefix string
	// Clock times the retries and stamps each set read (Holder.Apply's now). Default
	// clock.Real().
	Clock clock.Clock
	// Logger. Default hclog.NewNullLogger().
	Logger hclog.Logger
	// Timeout bounds one etcd list. Default 5s; must be > 0.
	Timeout time.Duration
	// BackoffMin and BackoffMax bound the wait between attempts while etcd fails
	// (doubling). Defaults 100ms and 2s; both > 0, min <= max.
	BackoffMin, BackoffMax time.Duration
}

// DefaultWatcherConfig returns the defaults above.
func DefaultWatcherConfig() WatcherConfig {
	return WatcherConfig{
		Prefix: contract.SharesPrefix, Clock: clock.Real(), Logger: hclog.NewNullLogger(),
		Timeout: 5 * time.Second, BackoffMin: 100 * time.Millisecond, BackoffMax: 2 * time.Second,
	}
}

// Validate names the first bad field and value.
func (c *WatcherConfig) Validate() error {
	switch {
	case c.Prefix == "":
		return fmt.Errorf("%w: watcher prefix is empty (it would watch all of etcd)", ErrConfig)
	case c.Clock == nil:
		return fmt.Errorf("%w: watcher clock is nil", ErrConfig)
	case c.Logger == nil:
		return fmt.Errorf("%w: watcher logger is nil", ErrConfig)
	case c.Timeout <= 0:
		return fmt.Errorf("%w: watcher timeout %v, must be > 0", ErrConfig, c.Timeout)
	case c.BackoffMin <= 0 || c.BackoffMax < c.BackoffMin:
		return fmt.Errorf("%w: watcher backoff %v..%v, want 0 < min <= max", ErrConfig, c.BackoffMin, c.BackoffMax)
	}
	return nil
}

// Watcher keeps a Holder up to date with the share set published under an etcd prefix
// (pkg/contract: <prefix>head and <prefix>chunk/<i>).
//
// It lists the prefix, then watches it from the next revision, and keeps a mirror of the
// head and the decoded chunks. After every change it offers the Holder a set only when the
// head is newer than the set in force and every chunk i the head names carries the head's
// LeaderRev and Head.ChunkVersion(i) and together they hold Head.Entries entries; a head whose chunks do
// not match (not all written yet, or left by a failed publication) is not applied — the
// Watcher waits for the chunks or the next head. A head that names the set in force only
// refreshes it (Holder.Apply). The watch delivers a head within milliseconds of its write,
// so a new set is in force well within a second of the balancer's last write.
//
// On a compacted watch, or any watch failure, it lists again and watches anew, retrying
// with backoff on its clock while etcd is unreachable; meanwhile the Holder keeps the last
// good set (and lets it go stale after Config.Stale: see Holder). Safe for concurrent use.
// The zero value is not usable: call NewWatcher.
type Watcher struct {
	mu     sync.Mutex // mu guards head, chunks and rev
	head   *contract.Head
	chunks map[int]*mirrored
	rev    int64 // the etcd revision the mirror reflects; 0 before the first list

	loop routine.Routine // the goroutine Start begins
	lw   *etcdwatch.Loop
	h    *Holder
	cfg  WatcherConfig
	log  hclog.Logger
}

// mirrored is one chunk as read: its fencing token and version, and its entries (nil and
// bad set when it did not decode, so no head can match it).
type mirrored struct {
	leaderRev int64
	version   uint64
	entries   []contract.Entry
	bad       bool
}

// NewWatcher returns a watcher feeding h from cli. It does no I/O: call Load to read the
// set once (e.g. at start, with a deadline) and Start to keep watching.
func NewWatcher(cli *clientv3.Client, h *Holder, cfg WatcherConfig) (*Watcher, error) {
	switch {
	case cli == nil:
		return nil, fmt.Errorf("%w: watcher etcd client is nil", ErrConfig)
	case h == nil:
		return nil, fmt.Errorf("%w: watcher holder is nil", ErrConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	w := &Watcher{h: h, cfg: cfg, log: cfg.Logger.Named("shares-watch"), chunks: map[int]*mirrored{}}
	lw, err := etcdwatch.New(cli, etcdwatch.Config{
		Prefix: cfg.Prefix, Timeout: cfg.Timeout, Clock: cfg.Clock,
		Backoff: etcdwatch.Backoff{Min: cfg.BackoffMin, Max: cfg.BackoffMax},
	}, etcdwatch.Handler{
		OnList:   func(_ context.Context, kvs []*mvccpb.KeyValue, rev int64) { w.install(kvs, rev) },
		OnEvents: func(_ context.Context, evs []*clientv3.Event, _ int64) { w.apply(evs) },
		OnError:  w.failed,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	w.lw = lw
	return w, nil
}

// Load lists the prefix once and offers the set it finds to the Holder. It returns the
// etcd error, if any (the Holder keeps what it has).
func (w *Watcher) Load(ctx context.Context) error {
	if w.loop.Closed() {
		return ErrClosed
	}
	kvs, rev, err := w.lw.List(ctx)
	if err != nil {
		return fmt.Errorf("shares: %w", err)
	}
	w.install(kvs, rev)
	return nil
}

// Start begins watching in a goroutine the Watcher owns, until Close. It returns
// ErrClosed after Close and an error when already started.
func (w *Watcher) Start() error {
	err := w.loop.Start(w.lw.Run) // after a Load, it watches on from Load's revision
	if errors.Is(err, routine.ErrClosed) {
		return ErrClosed
	}
	if err != nil {
		return fmt.Errorf("shares: watcher: %w", err)
	}
	return nil
}

// Close stops the watch and waits for its goroutine. Idempotent: every call waits; the
// Holder keeps its set.
func (w *Watcher) Close() error {
	w.loop.Close()
	return nil
}

// failed logs a failed list or an ended watch; the Holder keeps the set in force.
func (w *Watcher) failed(_ context.Context, f etcdwatch.Failure) {
	err := fmt.Errorf("shares: %w", f.Err)
	if f.Listing {
		w.log.Warn("listing shares in etcd failed; keeping the shares in force", "prefix", w.cfg.Prefix, "error", err, "retry-in", f.RetryIn)
		return
	}
	if f.Compacted {
		w.log.Info("shares watch compacted; listing again", "prefix", w.cfg.Prefix)
		return
	}
	w.log.Warn("shares watch failed; listing again", "prefix", w.cfg.Prefix, "error", err, "retry-in", f.RetryIn)
}

// install replaces the mirror with the whole prefix as of rev and offers the set.
func (w *Watcher) install(kvs []*mvccpb.KeyValue, rev int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if rev < w.rev {
		return // a watch already brought the mirror further (this was a Load racing it)
	}
	w.head, w.chunks = nil, map[int]*mirrored{}
	for _, kv := range kvs {
		w.putLocked(string(kv.Key), kv.Value)
	}
	w.rev = rev
	if w.head == nil {
		w.h.MarkLoaded() // nothing published: the default split is what the balancer gave
	}
	w.offerLocked()
}

// apply folds one watch response's events into the mirror, then offers the set once.
func (w *Watcher) apply(evs []*clientv3.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	changed := false
	for _, ev := range evs {
		if ev.Kv.ModRevision <= w.rev {
			continue // a list already brought us past it
		}
		k := string(ev.Kv.Key)
		switch ev.Type {
		case mvccpb.PUT:
			w.putLocked(k, ev.Kv.Value)
		case mvccpb.DELETE:
			if k == contract.HeadKey(w.cfg.Prefix) {
				w.head = nil // the Holder keeps its set; it goes stale in time
			} else if i, ok := contract.ChunkIndex(w.cfg.Prefix, k); ok {
				delete(w.chunks, i)
			}
		}
		w.rev = ev.Kv.ModRevision
		changed = true
	}
	if changed {
		w.offerLocked()
	}
}

// putLocked decodes one key of the prefix into the mirror. Caller holds w.mu.
func (w *Watcher) putLocked(key string, value []byte) {
	if key == contract.HeadKey(w.cfg.Prefix) {
		h, err := contract.DecodeHead(value)
		if err != nil {
			w.log.Warn("share head does not decode; ignored", "key", key, "error", err)
			w.head = nil
			return
		}
		w.head = &h
		return
	}
	i, ok := contract.ChunkIndex(w.cfg.Prefix, key)
	if !ok {
		return // not ours (another tool's key under the prefix)
	}
	c, err := contract.DecodeChunk(value)
	if err == nil && c.Index != i {
		err = fmt.Errorf("chunk at index %d says index %d", i, c.Index)
	}
	if err != nil {
		w.log.Warn("share chunk does not decode; no head can use it until it is rewritten", "key", key, "error", err)
		w.chunks[i] = &mirrored{bad: true}
		return
	}
	w.chunks[i] = &mirrored{leaderRev: c.LeaderRev, version: c.Version, entries: c.Entries}
}

// Revision is the etcd revision the watcher has read up to: every write to the prefix at
// or before it has been offered to the Holder. 0 before the first list.
func (w *Watcher) Revision() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rev
}

// offerLocked offers the mirrored set to the Holder when it is whole: see Watcher. Caller
// holds w.mu (the Holder's Apply is CPU only).
func (w *Watcher) offerLocked() {
	h := w.head
	if h == nil {
		return
	}
	now := w.cfg.Clock.Now()
	rev, ver := w.h.Applied()
	if !contract.Newer(h.LeaderRev, h.Version, rev, ver) {
		w.h.Apply(*h, nil, now) // a confirmation of the set in force, or an older one ignored
		return
	}
	n := 0
	for i := range h.Chunks {
		c := w.chunks[i]
		if c == nil || c.bad || c.leaderRev != h.LeaderRev || c.version != h.ChunkVersion(i) {
			w.log.Debug("share head waits for its chunks", "leader-rev", h.LeaderRev, "version", h.Version, "chunk", i)
			return
		}
		n += len(c.entries)
	}
	if n != h.Entries {
		w.log.Warn("share set not applied: its chunks hold a different number of entries than its head says",
			"leader-rev", h.LeaderRev, "version", h.Version, "head-entries", h.Entries, "chunk-entries", n)
		return
	}
	entries := make([]contract.Entry, 0, n)
	for i := range h.Chunks {
		entries = append(entries, w.chunks[i].entries...)
	}
	// The chunks stay mirrored: a later version rewrites only those that changed.
	w.h.Apply(*h, entries, now)
}
