// Package overrides is the enforcer's table of per-identity shares: which part of each
// limited identity's global limit this region enforces, as the quota balancer published
// it (docs/design.md §9, the etcd format in pkg/contract).
//
// # What a check sees
//
// A limited identity is (rule id, identity), e.g. the `default` rule for "key:k_123". The
// balancer lists only the identities whose shares differ from the default split; every
// other identity keeps its rule's default share for this region (rules.Compiled.Share, the
// rule's shares: or the region weights). For one check the enforcer asks Holder.Share and,
// when the answer differs from the rule's default, enforces the rule's global limits × the
// share, rate and burst (rules.Compiled.LimitsFor).
//
// # Which way it errs
//
// The Holder never enforces more than the balancer allowed this region. When the set it
// holds has not been refreshed for Config.Stale (the balancer republishes its head every
// interval, so this means the leader is lost or this region is cut off from etcd), each
// listed identity falls back to min(last share, default share): both the balancer's shares
// and the default split sum to at most 1 over the regions, so the minimum does too,
// whichever of the two every other region is enforcing. The error is then under the
// global limit, never over it. A set from an older leader (a lower fencing token,
// Head.LeaderRev) is ignored whatever its version, so a deposed leader cannot undo a newer
// leader's decreases.
//
// With Config.Reports (the enforcer sends usage reports), the same fallback also starts
// when the balancer has not accepted a report from this enforcer for Config.Stale (Heard):
// the balancer then holds this region silent and, once the same period has passed, hands
// the rest of the limit to the other regions on the understanding that this region
// enforces at most min(last, default). The enforcer must switch by then whether or not it
// can still read etcd: a region cut off from the balancer but not from etcd would
// otherwise keep its last share, refreshed, while the others were given the rest.
//
// "Refreshed" is Head.PublishedAt as the balancer wrote it, but never later than the time
// the Holder saw it: a balancer whose clock is ahead cannot make a set look fresher than
// it is, and an enforcer that starts and finds a head last written an hour ago treats it
// as an hour old at once. A balancer clock behind by δ makes sets look δ older (they go
// stale δ early: under).
//
// An entry that does not list this region (a balancer that does not know it) is held at
// min(default, 1 − Σ the listed shares), so it too keeps the sum ≤ 1.
//
// # Before the set is loaded
//
// With Config.WaitForSet (the shares are read from etcd), a Holder that has not yet
// loaded a set — an enforcer restarted while etcd is unreachable — does not know what the
// balancer gave this region: it may have moved a key's share away (the region at the
// floor, another region at 0.98). Until the first set is applied (or the watcher has
// listed etcd and found none published, MarkLoaded), every identity enforces
// min(default share, Config.Floor): the least the balancer's policy leaves any region, so
// whatever it gave the others, the sum stays ≤ 1. (Not quite always: regions held at what
// they may apply can leave the others less than the floor, share.Allocate; so the node
// also marks itself fenced in its region's store until the set is loaded, and the
// balancer keeps the region's default share reserved while its reports count that;
// pkg/enforcer/node.) That errs under, by the default share less the floor, for as long
// as etcd stays unreachable; Loaded says so (the enforcer's
// /readyz names it, and allot_shares_loaded is 0). The enforcer stays in rotation: taking
// it out would turn the gateway's limiter errors into unlimited traffic.
package overrides

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
)

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("shares: bad config")

// DefaultStale is how long a set stays in force without a refresh (docs/design.md §9: 5 minutes).
const DefaultStale = 5 * time.Minute

// DefaultFloor is Config.Floor's default: pkg/share's default floor.
const DefaultFloor = 0.01

// Config configures a Holder. Start from DefaultConfig and set Region.
type Config struct {
	// Region is this enforcer's region: the share of each entry it enforces. Required.
	Region string
	// Reports says this enforcer reports usage to the balancer, which calls Heard after
	// every accepted report: a set is then also stale Stale after the last accepted report
	// (since NewHolder before the first). False: only the refresh counts.
	Reports bool
	// Stale is how long a set stays in force without a refresh; after it every listed
	// identity enforces min(last share, default share). Default DefaultStale; must be > 0.
	Stale time.Duration
	// WaitForSet: the set comes from etcd (a Watcher); until it is loaded every identity
	// enforces min(default share, Floor) (see the package doc). False: no balancer, the
	// default split is the rule.
	WaitForSet bool
	// Floor is the share enforced before the set is loaded (WaitForSet): at most the
	// smallest share the balancer gives a region (its policy's floor). Default
	// DefaultFloor; in [0, 1].
	Floor float64
	// Clock tells the time for the share-age metric. Default clock.Real().
	Clock clock.Clock
	// Logger receives one line per set applied or ignored. Default hclog.NewNullLogger().
	Logger hclog.Logger
	// Registerer, if set, gets the Holder's metrics (allot_shares_*). Nil: no metrics.
	Registerer prometheus.Registerer
}

// DefaultConfig returns the defaults; Region is left for the caller.
func DefaultConfig() Config {
	return Config{Stale: DefaultStale, Floor: DefaultFloor, Clock: clock.Real(), Logger: hclog.NewNullLogger()}
}

// Validate names the first bad field and value.
func (c *Config) Validate() error {
	switch {
	case c.Region == "":
		return fmt.Errorf("%w: region is empty", ErrConfig)
	case c.Stale <= 0:
		return fmt.Errorf("%w: stale %v, must be > 0", ErrConfig, c.Stale)
	case !(c.Floor >= 0 && c.Floor <= 1):
		return fmt.Errorf("%w: floor %v, must be in [0, 1]", ErrConfig, c.Floor)
	case c.Clock == nil:
		return fmt.Errorf("%w: clock is nil", ErrConfig)
	case c.Logger == nil:
		return fmt.Errorf("%w: logger is nil", ErrConfig)
	}
	return nil
}

// key names one limited identity. A struct of two strings: a map lookup hashes both
// without building a string, so Share allocates nothing.
type key struct{ rule, identity string }

// held is this region's part of one entry.
type held struct {
	share  float64 // the entry's share for this region, or 1 − Σ listed when not listed
	listed bool    // the entry names this region
}

// set is one immutable snapshot: the shares of one published version.
type set struct {
	leaderRev int64
	version   uint64
	shares    map[key]held
	fresh     time.Time // when the balancer last confirmed it (see the package doc)
	phase     string
	invalid   int // entries skipped as invalid
}

// Holder serves this region's per-identity shares and swaps the whole table atomically: a
// check sees one published version or the next, never a mix. Share is one atomic load and
// one map lookup (no lock, no allocation). Safe for concurrent use. The zero value is not
// usable: call NewHolder. Before any set is applied every identity has its default share.
type Holder struct {
	mu      sync.Mutex // mu serialises Apply (its read, build and swap); Share takes no lock
	cfg     Config
	log     hclog.Logger
	cur     atomic.Pointer[set]
	started time.Time // for the age metric before the first set
	m       *metrics
	changed chan struct{} // one pending signal: a new set was swapped in (see Changed)
	heard   atomic.Int64  // Unix ns of the last accepted usage report (Config.Reports)
	seq     atomic.Uint64 // that report's seq (0: none accepted yet)
	// leaderSet: the newest set the leader had made when it took that report.
	leaderSet atomic.Pointer[leaderSet]
	loaded    atomic.Bool // a set was applied, or none is published (Config.WaitForSet)
	// cut: the enforcer fenced itself as cut off alone (CutOff), Unix ns, 0 if not. While
	// cut, every identity enforces min(share, default) as when stale.
	cut atomic.Int64
}

// Changed receives after a new set was swapped in (a refresh of the set in force does not
// signal). Signals coalesce: one pending at most, for one consumer — the usage reporter,
// whose early report acknowledges the new version to the balancer, so a change plan's
// increase waits about a propagation delay rather than a report interval.
func (h *Holder) Changed() <-chan struct{} { return h.changed }

// NewHolder validates cfg and returns a Holder with no set (the default split for all).
func NewHolder(cfg Config) (*Holder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	h := &Holder{cfg: cfg, log: cfg.Logger.Named("shares"), started: cfg.Clock.Now(), changed: make(chan struct{}, 1)}
	h.cur.Store(&set{})
	h.loaded.Store(!cfg.WaitForSet)
	if cfg.Reports {
		h.heard.Store(h.started.UnixNano())
	}
	if cfg.Registerer != nil {
		m, err := newMetrics(cfg.Registerer, h)
		if err != nil {
			return nil, fmt.Errorf("shares: while registering metrics: %w", err)
		}
		h.m = m
	}
	return h, nil
}

// Apply offers a published set: head and all its entries (entries may be nil for a head
// that only confirms the set in force). It returns true when the set was swapped in,
// which happens only when (head.LeaderRev, head.Version) is newer than the set held
// (contract.Newer). A head naming the set in force refreshes it (PublishedAt moves, so it
// does not go stale) and returns false; anything older is ignored. Entries that fail
// contract.Entry.Validate are skipped (logged and counted), never enforced. now is the
// time the set was read (it bounds PublishedAt: see the package doc).
func (h *Holder) Apply(head contract.Head, entries []contract.Entry, now time.Time) bool {
	return h.ApplyPrepared(Prepare(h.cfg.Region, head, entries), now)
}

// Prepared is a published set (a head and its entries) as the Holders of one region
// enforce it: its table is built at most once, by the first ApplyPrepared that swaps it
// in, however many Holders of the region apply it. regionsim's enforcers of a region read
// one virtual etcd: each of them validating and indexing every entry of every version
// was a twentieth of a 10,000-key run. Safe for concurrent use; the entries must not be
// modified once prepared.
type Prepared struct {
	region  string
	head    contract.Head
	entries []contract.Entry
	once    sync.Once
	shares  map[key]held
	invalid int
	errs    []error // the first invalid entries' errors, which each Holder logs
}

// Prepare prepares the set (head, entries) for the Holders of region (Config.Region).
// It does no work until a Holder needs the table.
func Prepare(region string, head contract.Head, entries []contract.Entry) *Prepared {
	return &Prepared{region: region, head: head, entries: entries}
}

// build validates and indexes the entries, once.
func (p *Prepared) build() {
	p.once.Do(func() {
		p.shares = make(map[key]held, len(p.entries))
		for i := range p.entries {
			e := &p.entries[i]
			if err := e.Validate(); err != nil {
				p.invalid++
				if p.invalid <= 3 {
					p.errs = append(p.errs, err)
				}
				continue
			}
			v, ok := e.Shares[p.region]
			if !ok {
				v = 1
				for _, o := range e.Shares {
					v -= o
				}
				v = max(0, v)
			}
			p.shares[key{e.Rule, e.Identity}] = held{share: v, listed: ok}
		}
	})
}

// ApplyPrepared is Apply of a prepared set. A set prepared for another region than the
// Holder's is read again for its own.
func (h *Holder) ApplyPrepared(p *Prepared, now time.Time) bool {
	if p.region != h.cfg.Region {
		p = Prepare(h.cfg.Region, p.head, p.entries)
	}
	head := p.head
	h.mu.Lock()
	defer h.mu.Unlock()
	old := h.cur.Load()
	fresh := head.PublishedAt
	if fresh.IsZero() || fresh.After(now) {
		fresh = now
	}
	if !contract.Newer(head.LeaderRev, head.Version, old.leaderRev, old.version) {
		if head.LeaderRev == old.leaderRev && head.Version == old.version {
			// The set in force, seen again: a later confirmation refreshes it; the same
			// one read twice (a watch event and a re-list) is nothing to say.
			if fresh.After(old.fresh) {
				next := *old
				next.fresh = fresh
				h.cur.Store(&next)
			}
			return false
		}
		h.count(ignoredOlder)
		h.log.Warn("share set ignored: not newer than the one in force",
			"leader-rev", head.LeaderRev, "version", head.Version, "held-leader-rev", old.leaderRev, "held-version", old.version)
		return false
	}
	p.build()
	// The table is shared with the other Holders that applied p: a set is never written
	// once built (Share only reads it).
	s := &set{leaderRev: head.LeaderRev, version: head.Version, fresh: fresh, phase: head.Phase,
		shares: p.shares, invalid: p.invalid}
	for _, err := range p.errs {
		h.log.Warn("share entry skipped", "error", err)
	}
	h.cur.Store(s)
	h.loaded.Store(true)
	select { // tell the usage reporter: an early report acknowledges the new version
	case h.changed <- struct{}{}:
	default:
	}
	h.count(appliedSet)
	h.log.Info("share set applied", "leader-rev", s.leaderRev, "version", s.version, "phase", s.phase,
		"entries", len(s.shares), "invalid", s.invalid, "published-at", head.PublishedAt)
	return true
}

// Share returns the share of rule's limits that identity may use in this region at now:
// the balancer's when the set in force lists it, else rule.Share (the default split).
// After Config.Stale without a refresh, or for an entry that does not list this region,
// it is min(that share, rule.Share). Zero allocations; one atomic load and a map lookup.
func (h *Holder) Share(rule *rules.Compiled, identity string, now time.Time) float64 {
	def := rule.Share
	s := h.cur.Load()
	if len(s.shares) == 0 {
		if !h.loaded.Load() {
			return min(def, h.cfg.Floor) // not loaded yet: see the package doc
		}
		return def
	}
	e, ok := s.shares[key{rule.ID, identity}]
	if !ok {
		return def
	}
	if !e.listed || h.stale(s, now) {
		return min(e.share, def)
	}
	return e.share
}

// stale: s not refreshed for Stale, or (Config.Reports) no report accepted for Stale, or
// cut off (CutOff).
func (h *Holder) stale(s *set, now time.Time) bool {
	return h.cut.Load() != 0 || h.staleByTime(s, now)
}

func (h *Holder) staleByTime(s *set, now time.Time) bool {
	if !now.Before(s.fresh.Add(h.cfg.Stale)) {
		return true
	}
	heard := h.heard.Load()
	return heard != 0 && now.UnixNano()-heard >= int64(h.cfg.Stale)
}

// MarkLoaded records that the set's source was read and holds no set (nothing published
// yet): the default split is then what the balancer gave. Applying a set marks it too.
func (h *Holder) MarkLoaded() { h.loaded.Store(true) }

// Loaded reports whether a set was loaded (always true without Config.WaitForSet). Before
// it, every identity enforces min(default share, Config.Floor).
func (h *Holder) Loaded() bool { return h.loaded.Load() }

// Heard records that the balancer accepted a usage report at t (see Config.Reports).
// Safe for concurrent use; an earlier t than the one held is ignored.
func (h *Holder) Heard(t time.Time) {
	n := t.UnixNano()
	for {
		old := h.heard.Load()
		if old == 0 || n <= old || h.heard.CompareAndSwap(old, n) {
			return
		}
	}
}

// HeardReport is Heard with the accepted report's seq (the reports' Accepted hook): the
// seq a fenced enforcer's mark names (pkg/bucket.Fences), and the newest set the leader
// had made then (leaderRev, version; 0 and 0 when it did not say), which Current compares
// with the set in force. A seq lower than the one held is ignored.
func (h *Holder) HeardReport(t time.Time, seq uint64, leaderRev int64, version uint64) {
	h.Heard(t)
	for {
		old := h.seq.Load()
		if seq <= old {
			return
		}
		if h.seq.CompareAndSwap(old, seq) {
			h.leaderSet.Store(&leaderSet{rev: leaderRev, ver: version})
			return
		}
	}
}

// leaderSet is the newest set a leader had made when it took this enforcer's last
// accepted report.
type leaderSet struct {
	rev int64
	ver uint64
}

// Current reports whether the set in force is as new as the newest the leader had made
// when it took the last accepted report (a set of a later leader, or the same leader's at
// that version or later) — or, when the leader did not say, whether it was refreshed
// after since.
func (h *Holder) Current(since time.Time) bool {
	l := h.leaderSet.Load()
	if l == nil || l.rev == 0 {
		return h.Refreshed().After(since)
	}
	s := h.cur.Load()
	return s.leaderRev > l.rev || s.leaderRev == l.rev && s.version >= l.ver
}

// LastHeard returns when the balancer last accepted a usage report and that report's seq
// (the zero time and 0 before any: NewHolder's start does not count).
func (h *Holder) LastHeard() (time.Time, uint64) {
	seq := h.seq.Load()
	if seq == 0 {
		return time.Time{}, 0
	}
	return time.Unix(0, h.heard.Load()), seq
}

// CutOff makes every identity enforce min(its share, default) from now, as a stale set
// does, until Rejoin: the enforcer found itself cut off from the control plane while its
// region-mates are heard (pkg/enforcer/node), and fenced itself without waiting for Stale.
// at is kept for Cut; seq (the last accepted report's) is logged. A second call keeps the
// first.
func (h *Holder) CutOff(at time.Time, seq uint64) {
	if h.cut.CompareAndSwap(0, max(at.UnixNano(), 1)) {
		h.log.Warn("cut off from the control plane while the region's other enforcers are heard: enforcing min(share, default) until a report is accepted and a set is read again",
			"last-accepted-seq", seq)
	}
}

// Rejoin ends CutOff.
func (h *Holder) Rejoin() {
	if h.cut.Swap(0) != 0 {
		h.log.Info("heard again with a fresh set: enforcing the shares as published")
	}
}

// Cut returns when CutOff began (the zero time when not cut off).
func (h *Holder) Cut() time.Time {
	at := h.cut.Load()
	if at == 0 {
		return time.Time{}
	}
	return time.Unix(0, at)
}

// Refreshed returns when the set in force was last confirmed by the balancer (the zero
// time before any set).
func (h *Holder) Refreshed() time.Time { return h.cur.Load().fresh }

// Applied returns the fencing token and version of the set in force (0, 0 before any):
// what usage reports say this enforcer applies.
func (h *Holder) Applied() (leaderRev int64, version uint64) {
	s := h.cur.Load()
	return s.leaderRev, s.version
}

// Age is how long ago the set in force was last confirmed by the balancer (since
// NewHolder before any set).
func (h *Holder) Age(now time.Time) time.Duration {
	s := h.cur.Load()
	if s.fresh.IsZero() {
		return now.Sub(h.started)
	}
	return now.Sub(s.fresh)
}

// Stale reports whether the set in force is past Config.Stale at now, by its refresh or
// (Config.Reports) by the last accepted report (false before any set: the default split
// is never stale).
func (h *Holder) Stale(now time.Time) bool {
	s := h.cur.Load()
	return !s.fresh.IsZero() && h.staleByTime(s, now)
}

// Len is the number of identities the set in force lists.
func (h *Holder) Len() int { return len(h.cur.Load().shares) }

func (h *Holder) count(o outcome) {
	if h.m != nil {
		h.m.sets[o].Inc()
	}
}
