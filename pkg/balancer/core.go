package balancer

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/share"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// Errors of Ingest and Restore. Every invalid report wraps ErrInvalidReport.
var (
	ErrInvalidReport = errors.New("balancer: invalid report")
	// ErrTooManyEnforcers: a report from an enforcer beyond MaxEnforcers in its region.
	ErrTooManyEnforcers = errors.New("balancer: too many enforcers in the region")
	// ErrRestoreLate: Restore after the core started (first Ingest or Tick) or twice.
	ErrRestoreLate = errors.New("balancer: restore after start")
)

// MaxNameLen bounds a report's rule id, identity and enforcer id (bytes).
const MaxNameLen = 512

// eps is the tolerance under which two shares are equal.
const eps = 1e-9

// Publication is what Tick asks to be written. Changed: a new version, Head.Version one
// more than the last; write Entries (contract.Split) then the head. Not Changed: a head
// refresh of the version in force (Entries nil; the publisher keeps the chunk count it
// wrote), so enforcers see the balancer alive. Head.Chunks is left 0 for the publisher.
type Publication struct {
	Head    contract.Head
	Entries []contract.Entry
	Changed bool
}

type key struct{ rule, identity string }

// ident is one tracked limited identity. vals holds four per-region slices in one
// allocation: published, target, this window's tokens and this window's recent rates.
type ident struct {
	k        key
	idx      int // in Core.all
	rate     float64
	requests float64   // Limits.Requests
	def      []float64 // shared, never modified
	st       share.State
	vals     []float64
	hist     []histEntry // earlier versions some region may still apply; nil when settled
	pubVer   uint64      // the version published took its value at
	lastSeen time.Time   // last report naming it (zero: since the core started)
	pending  bool        // in Core.pending
	evict    bool        // forget it once it is back at the default split
	shift    bool        // a report this window showed its traffic moved (Core.shifted)
	moved    uint64      // the regions whose reports showed it (bit min(r, 63))
	origin   int         // the region whose report added it (-1: restored), see Ingest
}

func (id *ident) published(n int) []float64 { return id.vals[:n:n] }
func (id *ident) target(n int) []float64    { return id.vals[n : 2*n : 2*n] }
func (id *ident) tokens(n int) []float64    { return id.vals[2*n : 3*n : 3*n] }

// recent is Σ over this window's reports of the recent rates (tokens/s over about the
// last second, IdentityUsage.recent_rate) they carried for the identity.
func (id *ident) recent(n int) []float64 { return id.vals[3*n : 4*n : 4*n] }

// valsPer is the float64s of vals per region.
const valsPer = 4

type enforcerState struct {
	maxSeq     uint64
	bits       uint64 // bit d: seq maxSeq-d was seen
	lastHeard  time.Time
	appliedRev int64
	appliedVer uint64
	window     uint64 // the window it last reported in
	lastEndMs  int64  // the end of its last report's interval (Ingest counts seconds from it)
}

// dup reports whether seq was seen before, changing nothing.
func (e *enforcerState) dup(seq uint64) bool {
	switch {
	case e.bits == 0 || seq >= e.maxSeq+64 || seq > e.maxSeq:
		return false
	case e.maxSeq-seq < 64:
		return e.bits&(uint64(1)<<(e.maxSeq-seq)) != 0
	}
	return false
}

// seen records seq and reports whether it was seen before. A seq more than 64 below the
// highest is a restarted process (its seq starts again): the history restarts.
func (e *enforcerState) seen(seq uint64) bool {
	switch {
	case e.bits == 0 || seq >= e.maxSeq+64:
		e.maxSeq, e.bits = seq, 1
	case seq > e.maxSeq:
		e.bits = e.bits<<(seq-e.maxSeq) | 1
		e.maxSeq = seq
	case e.maxSeq-seq < 64:
		b := uint64(1) << (e.maxSeq - seq)
		if e.bits&b != 0 {
			return true
		}
		e.bits |= b
	default:
		e.maxSeq, e.bits = seq, 1
	}
	return false
}

type regionState struct {
	name       string
	enforcers  map[string]*enforcerState
	lastHeard  time.Time
	heard      bool // since the core started (learning)
	winSecs    float64
	winEnfs    int
	winReports int // reports this window (recent rates are summed over them)
	winRecent  int // of which measured recent rates (an older enforcer's do not)
	owned      int // identities its reports added that are still tracked (ident.origin)
	// fencedUntil: an enforcer of the region fenced itself (see acks) and may enforce up
	// to its default split until then; the region keeps that much reserved.
	fencedUntil time.Time
	reports     uint64
	lag         time.Duration
	driftSum    float64
	driftMax    float64
}

// Core is the balancer's decision: reports in, versioned share sets out. It guarantees
// that every share set it returns sums to ≤ 1 per identity and that, as long as every
// enforcer takes sets only forward (contract.Newer) and fences itself by its own staleness
// rule (pkg/enforcer/overrides), the sets in force across regions sum to ≤ 1 too: only
// usage reports acknowledge a decrease, so an increase waits until every enforcer of the
// regions being decreased has reported applying it — or has fenced itself (Stale +
// AckTimeout after its last report) or left with a final report — never for a time (see
// acks and the package doc). It errs under: an identity whose traffic moved is held below
// its global limit until the decrease elsewhere is acknowledged. It does no I/O and starts
// no goroutine; it is safe for concurrent use (one mutex). Build it with NewCore; the zero
// value is not usable.
type Core struct {
	mu sync.Mutex // mu guards every field below cfg, n and regionIdx

	cfg       CoreConfig
	n         int
	regionIdx map[string]int
	weights   []float64

	regions []regionState
	ids     map[key]*ident
	all     []*ident // the same identities, for iteration in allocation order
	pending map[*ident]struct{}
	free    []*ident  // forgotten identities, for reuse
	slab    []ident   // identities not handed out yet
	slabVal []float64 // their vals

	started       bool
	start         time.Time
	learning      bool
	nextDue       time.Time
	lastCompute   time.Time
	fullStep      bool // a recompute's targets wait for the next advance over every identity
	shiftStep     bool // that recompute was asked for by a shift: no MinVersionGap
	lastVersionAt time.Time
	earlyPending  bool
	shiftPending  bool // a report's recent rates showed a key's traffic moved (shifted)
	window        uint64

	version     uint64 // the last version returned by Tick
	landed      uint64 // the last version Published
	dirty       bool   // a new version must be written (new term, or published changed)
	log         []verEntry
	lastHeadAt  time.Time
	restoredRev int64
	restoredVer uint64
	listed      int
	held        bool // the last version held an increase back
	lastCompDur time.Duration
	stats       counters
	mayBuf      []float64
	// gone[r]: region r has been silent for Stale + AckTimeout (see acks): whatever it
	// enforces is at most min(its share, the default split).
	gone []bool
	// fenced[r]: an enforcer of region r fenced itself (silent for Stale + AckTimeout) less
	// than Stale ago while others of r report; it enforces at most its default split.
	fenced []bool
	// rankBuf is capPublished's and capTracked's scratch (one recompute at a time).
	rankBuf []ranked
}

type counters struct {
	recomputes, duplicates, invalid, unknownRule, dropped, evicted, clamped uint64
}

// ReserveTotal caps what the idle regions of an identity keep in reserve together: the
// floor each region gets is min(CoreConfig.Share.Floor, ReserveTotal / (regions − 1)).
// With the default 1% floor that changes nothing up to 3 regions.
const ReserveTotal = 0.02

// NewCore validates cfg and returns a core for one leadership term.
func NewCore(cfg CoreConfig) (*Core, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Regions = append([]string(nil), cfg.Regions...)
	n := len(cfg.Regions)
	if n > 1 {
		// The idle regions' reserve is at most ReserveTotal of the limit whatever the
		// region count, so a busy key keeps ≥ 98% of it (steady_ratio ≥ 0.97 with 10
		// regions; a 1% floor each capped it at 91%).
		cfg.Share.Floor = min(cfg.Share.Floor, ReserveTotal/float64(n-1))
	}
	c := &Core{
		cfg: cfg, n: n, regionIdx: make(map[string]int, n), weights: cfg.weightSplit(),
		regions: make([]regionState, n), ids: map[key]*ident{}, pending: map[*ident]struct{}{},
		learning: true, dirty: true, mayBuf: make([]float64, n), gone: make([]bool, n), fenced: make([]bool, n),
	}
	for i, r := range cfg.Regions {
		c.regionIdx[r] = i
		c.regions[i] = regionState{name: r, enforcers: map[string]*enforcerState{}}
	}
	return c, nil
}

// begin starts the clock of the core (learning, schedule) at its first call.
func (c *Core) begin(now time.Time) {
	if c.started {
		return
	}
	c.started, c.start = true, now
	c.nextDue = now.Add(c.cfg.Interval)
	for i := range c.log {
		if c.log[i].landed.IsZero() {
			c.log[i].landed = now // the restored version: in force since before us
		}
	}
}

// Restore seeds a new leader's core with the persisted set (head and every chunk's
// entries): those shares stand until the learning period ends, and the first Publication
// rewrites them under this core's LeaderRev with head.Version+1. Entries whose rule
// LimitsFunc does not know are dropped (their enforcers have no such rule either); a
// region of ours the set does not name gets 0 for those entries. Call it before the first
// Ingest or Tick, at most once (ErrRestoreLate otherwise).
func (c *Core) Restore(head contract.Head, entries []contract.Entry) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started || c.restoredRev != 0 || len(c.ids) > 0 {
		return ErrRestoreLate
	}
	c.version, c.landed = head.Version, head.Version
	c.restoredRev, c.restoredVer = head.LeaderRev, head.Version
	c.log = append(c.log, verEntry{v: head.Version})
	for i := range entries {
		e := &entries[i]
		if e.Rule == "" || e.Identity == "" || e.Validate() != nil {
			continue
		}
		if c.ids[key{e.Rule, e.Identity}] != nil {
			continue
		}
		id, _, ok := c.newIdent(e.Rule, e.Identity)
		if !ok {
			continue
		}
		pub := id.published(c.n)
		for r, name := range c.cfg.Regions {
			pub[r] = e.Shares[name]
		}
		copy(id.target(c.n), pub)
		id.st.Shares = append([]float64(nil), pub...)
		id.pubVer = head.Version
	}
	c.listed = c.countListed()
	return nil
}

// newIdent builds an identity at the default split and returns its Limits too; ok is
// false for an unknown rule.
func (c *Core) newIdent(rule, identity string) (*ident, Limits, bool) {
	l, ok := c.cfg.Limits(rule, identity)
	rate, def := l.Rate, l.Default
	if !ok || !(rate > 0) || math.IsInf(rate, 0) || (def != nil && len(def) != c.n) {
		c.stats.unknownRule++
		return nil, Limits{}, false
	}
	if def == nil {
		def = c.weights
	}
	const slabLen = 4096
	var id *ident
	if f := len(c.free); f > 0 {
		id = c.free[f-1]
		c.free = c.free[:f-1]
	} else {
		if len(c.slab) == 0 { // identities allocated side by side: recompute walks them in order
			c.slab, c.slabVal = make([]ident, slabLen), make([]float64, slabLen*valsPer*c.n)
		}
		id = &c.slab[0]
		id.vals = c.slabVal[: valsPer*c.n : valsPer*c.n]
		c.slab, c.slabVal = c.slab[1:], c.slabVal[valsPer*c.n:]
	}
	id.k, id.rate, id.requests, id.def, id.idx, id.origin = key{rule, identity}, rate, l.Requests, def, len(c.all), -1
	copy(id.published(c.n), def)
	copy(id.target(c.n), def)
	c.ids[id.k] = id
	c.all = append(c.all, id)
	return id, l, true
}

// forget drops an identity (back at its default split, every region past its history).
func (c *Core) forget(id *ident) {
	if id.origin >= 0 {
		c.regions[id.origin].owned--
	}
	delete(c.ids, id.k)
	delete(c.pending, id)
	last := c.all[len(c.all)-1]
	c.all[id.idx], last.idx = last, id.idx
	c.all = c.all[:len(c.all)-1]
	vals := id.vals
	clear(vals)
	*id = ident{vals: vals}
	c.free = append(c.free, id)
	c.stats.evicted++
}

// validate checks a report whole before anything is recorded.
func (c *Core) validate(r *allotv1.ReportRequest) (int, error) {
	bad := func(format string, a ...any) (int, error) {
		return 0, fmt.Errorf("%w: "+format, append([]any{ErrInvalidReport}, a...)...)
	}
	if r == nil {
		return bad("nil report")
	}
	ri, ok := c.regionIdx[r.Region]
	switch {
	case !ok:
		return bad("unknown region %.64q", r.Region)
	case r.EnforcerId == "" || len(r.EnforcerId) > MaxNameLen:
		return bad("enforcer_id %.64q: empty or longer than %d bytes", r.EnforcerId, MaxNameLen)
	case r.IntervalEndMs <= r.IntervalStartMs:
		return bad("interval [%d, %d) ms is empty", r.IntervalStartMs, r.IntervalEndMs)
	case len(r.Usage) > c.cfg.MaxEntries:
		return bad("%d usage entries, more than %d", len(r.Usage), c.cfg.MaxEntries)
	case !count(r.OmittedTokens):
		return bad("omitted_tokens %g, must be finite and >= 0", r.OmittedTokens)
	}
	for i, u := range r.Usage {
		switch {
		case u == nil:
			return bad("usage[%d] is nil", i)
		case u.Rule == "" || u.Identity == "" || len(u.Rule) > MaxNameLen || len(u.Identity) > MaxNameLen:
			return bad("usage[%d]: rule %.64q identity %.64q: empty or longer than %d bytes", i, u.Rule, u.Identity, MaxNameLen)
		case !count(u.Admitted) || !count(u.Refused) || !count(u.Error) || !count(u.RegionalRate):
			return bad("usage[%d] (%s %s): admitted %g refused %g error %g regional_rate %g: must be finite and >= 0",
				i, u.Rule, u.Identity, u.Admitted, u.Refused, u.Error, u.RegionalRate)
		}
	}
	return ri, nil
}

func count(v float64) bool { return v >= 0 && !math.IsInf(v, 0) } // false for NaN too

// ClockSkew is how far ahead of the balancer's clock a report's interval may end (the
// enforcer's clock may run ahead of it).
const ClockSkew = 5 * time.Second

// claims checks what a valid report says against what can be true (issue 27): a share
// version this leader never published (only acknowledgements let increases out), a newer
// leader's set, and an interval that ends in the future (claimed seconds that did not pass
// would shrink the region's measured demand for every key; Ingest also counts an interval
// only from the end of the enforcer's last one). Called with c.mu held. Which way it
// errs: a report from a live enforcer whose clock jumped ahead is refused (its next one is
// taken), never believed.
func (c *Core) claims(now time.Time, r *allotv1.ReportRequest) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidReport}, a...)...)
	}
	switch {
	case r.ShareLeaderRev == c.cfg.LeaderRev && r.ShareVersion > c.version:
		return bad("share_version %d: this leader (rev %d) has published up to %d", r.ShareVersion, c.cfg.LeaderRev, c.version)
	case r.ShareLeaderRev > c.cfg.LeaderRev:
		return bad("share_leader_rev %d is newer than this leader's %d", r.ShareLeaderRev, c.cfg.LeaderRev)
	}
	if end := time.UnixMilli(r.IntervalEndMs); end.After(now.Add(ClockSkew)) {
		return bad("interval ends %v after the balancer's clock (more than the %v skew allowed)", end.Sub(now).Round(time.Millisecond), ClockSkew)
	}
	return nil
}

// Ingest records one enforcer's report. A malformed report (unknown region, empty
// enforcer id, a negative or non-finite count, more than MaxEntries entries, an empty
// interval) is refused whole with an error wrapping ErrInvalidReport and changes nothing;
// a retry of a report already counted (same region, enforcer id and seq) returns nil and
// changes nothing. Identities whose rule LimitsFunc does not know are skipped and counted.
func (c *Core) Ingest(now time.Time, r *allotv1.ReportRequest) error {
	ri, err := c.validate(r)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.stats.invalid++
		return err
	}
	c.begin(now)
	rs := &c.regions[ri]
	e := rs.enforcers[r.EnforcerId]
	if e != nil && e.dup(r.Seq) {
		c.stats.duplicates++
		return nil
	}
	if err := c.claims(now, r); err != nil {
		c.stats.invalid++
		return err
	}
	if e == nil {
		if len(rs.enforcers) >= c.cfg.MaxEnforcers {
			c.acks(now) // drops the enforcers that fenced themselves
		}
		if len(rs.enforcers) >= c.cfg.MaxEnforcers {
			c.stats.invalid++
			return fmt.Errorf("%w: %s has %d", ErrTooManyEnforcers, rs.name, len(rs.enforcers))
		}
		e = &enforcerState{}
		rs.enforcers[r.EnforcerId] = e
	}
	e.seen(r.Seq)
	e.lastHeard, e.appliedRev, e.appliedVer = now, r.ShareLeaderRev, r.ShareVersion
	if e.window != c.window+1 { // window numbers are offset by one so 0 means never
		e.window = c.window + 1
		rs.winEnfs++
	}
	// The seconds it covers, counted from the end of the enforcer's last report at the
	// earliest: an enforcer's intervals follow each other (each starts where the last
	// report's table was drained), so with ends no later than the balancer's clock (see
	// claims) its reports add up to at most the wall time — claimed seconds that did not
	// pass would shrink the region's measured demand for every key.
	start := r.IntervalStartMs
	if e.lastEndMs > start {
		start = e.lastEndMs
	}
	secs := min(max(float64(r.IntervalEndMs-start)/1000, 0.1), 2*c.cfg.Interval.Seconds()) // a table is drained every Interval
	rs.winSecs += secs
	e.lastEndMs = max(e.lastEndMs, r.IntervalEndMs)
	rs.lastHeard, rs.heard = now, true
	rs.reports++
	rs.winReports++
	if r.RecentWindowMs > 0 {
		rs.winRecent++
	}
	rs.lag = now.Sub(time.UnixMilli(r.IntervalEndMs))
	if r.Early {
		c.earlyPending = true
	}
	if r.Final {
		// It stopped answering checks: it enforces nothing any more, so neither its
		// acknowledgements nor its fence are waited for (see acks).
		delete(rs.enforcers, r.EnforcerId)
	}
	hardCap := c.cfg.MaxIdentities + c.cfg.MaxIdentities/8
	for _, u := range r.Usage {
		k := key{u.Rule, u.Identity}
		id := c.ids[k]
		// A quiet entry (no tokens: its traffic stopped since the enforcer's last report)
		// says only that its recent rate fell: it tracks nothing new and keeps nothing alive.
		quiet := u.Admitted == 0 && u.Refused == 0
		var lim Limits
		known := true
		if id == nil {
			if quiet {
				continue
			}
			// Past MaxIdentities a region adds identities only while those its reports
			// added number fewer than its part of MaxIdentities + 1/8, so one region's
			// flood (a certificate in an attacker's hands) never shuts out another's new
			// identities; recompute lets the least demanded of the regions over their
			// part go (fairLowest). At most regions × that part + MaxIdentities are tracked.
			if len(c.ids) >= c.cfg.MaxIdentities && rs.owned >= hardCap/c.n {
				c.stats.dropped++
				continue
			}
			if id, lim, known = c.newIdent(u.Rule, u.Identity); !known {
				continue
			}
			id.origin = ri
			rs.owned++
		} else {
			lim, known = c.cfg.Limits(u.Rule, u.Identity)
		}
		admitted := u.Admitted
		if m := lim.MaxAdmitted(secs); known && admitted > m {
			admitted = m
			c.stats.clamped++
		}
		id.tokens(c.n)[ri] += admitted + u.Refused
		id.recent(c.n)[ri] += u.RecentRate
		if !quiet {
			id.lastSeen = now
			id.evict = false
		}
		if r.RecentWindowMs > 0 && c.shifted(id, ri, u.RecentRate, max(1, len(rs.enforcers))) {
			id.shift, c.shiftPending = true, true
			id.moved |= regionBit(ri)
		}
	}
	return nil
}

// shifted says whether one enforcer's recent rate for an identity (of enfs enforcers in
// its region, which see about equal parts of its traffic) shows the traffic moved: the
// region's rate, estimated as recent × enfs, at least doubled from its smoothed demand and
// above its published share by more than the dead-band (traffic arrived, and is refused),
// or at most half of it and below by more than a quarter dead-band (traffic left) — each
// beyond the noise of one second of Poisson arrivals at that enforcer (3 standard
// deviations of the estimate, √(enfs × smoothed), and 10 tokens a second an enforcer: a
// key of a few a second is left to the interval's average). Such a
// report asks for a recompute at once (ShiftGap) whatever else it says — an
// acknowledgement of a decrease carries the region's new, lower rate — and that recompute
// reads the identity's demand from the recent rates (see recompute). A partial change
// (say 60/s to 240/s) is left to the interval's average and the early reports.
func (c *Core) shifted(id *ident, r int, recent float64, enfs int) bool {
	if !(id.rate > 0) || !(recent >= 0) || math.IsInf(recent, 0) {
		return false
	}
	// Not recomputed yet (a key the balancer first hears of): its demand was nothing, and
	// traffic that arrived above its default share is a move like any other.
	sm := 0.0
	if r < len(id.st.Smoothed) && !math.IsNaN(id.st.Smoothed[r]) {
		sm = id.st.Smoothed[r]
	}
	n := float64(enfs)
	est := recent * n
	noise := 3*math.Sqrt(n*max(sm, 1)) + 10*n
	db := c.cfg.Share.DeadBand
	switch {
	case est >= 2*sm+noise: // arrived
		return est/id.rate > id.published(c.n)[r]+db
	case est <= sm/2-noise: // left
		return (sm-est)/id.rate >= db/4
	}
	return false
}

// Published records that p landed (in etcd, or in a simulation): a changed version
// starts its AckTimeout, and any publication moves the head refresh clock.
func (c *Core) Published(p *Publication, now time.Time) {
	if p == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if p.Head.LeaderRev != c.cfg.LeaderRev {
		return
	}
	if p.Changed {
		for i := range c.log {
			if c.log[i].v == p.Head.Version && c.log[i].landed.IsZero() {
				c.log[i].landed = now
			}
		}
		c.landed = max(c.landed, p.Head.Version)
	}
	if p.Head.Version == c.version {
		c.lastHeadAt = now
	}
}

// recomputes is how many recomputes the core made (for the service's timing).
func (c *Core) recomputes() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats.recomputes
}

// IdentityState is one tracked identity as the core sees it, by region (copies).
type IdentityState struct {
	Rate      float64   // global rate, tokens/s
	Default   []float64 // default split
	Published []float64 // in the newest version
	Target    []float64 // where the plan is going
	Smoothed  []float64 // smoothed demand, tokens/s (nil before the first recompute)
	Pending   bool      // the plan has not finished (or a region may still apply an older version)
	// Version is the version Published took its value at: a region whose acknowledged
	// version (RegionStats.Acked) is below it may still apply an older share.
	Version uint64
}

// Identity returns the state of (rule, identity); ok is false when it is not tracked
// (it has the default split). For tools (explain) and simulations.
func (c *Core) Identity(rule, identity string) (IdentityState, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id := c.ids[key{rule, identity}]
	if id == nil {
		return IdentityState{}, false
	}
	return IdentityState{
		Rate: id.rate, Default: slices.Clone(id.def), Published: slices.Clone(id.published(c.n)),
		Target: slices.Clone(id.target(c.n)), Smoothed: slices.Clone(id.st.Smoothed), Pending: id.pending,
		Version: id.pubVer,
	}, true
}

// TopIdentity is one of the most demanded identities (Core.Top).
type TopIdentity struct {
	Rule, Identity string
	Demand         float64 // Σ over regions of the smoothed demand, tokens/s
	IdentityState
}

// Top returns at most n tracked identities with the largest total smoothed demand (> 0),
// most demanded first, ties by (rule, identity). For dashboards: it walks every tracked
// identity under the mutex (O(tracked × log n), no allocation beyond the n results;
// BenchmarkTop20Of1M), holding reports back meanwhile, so call it about once an interval,
// not per request.
func (c *Core) Top(n int) []TopIdentity {
	if n <= 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	less := func(a, b ranked) bool { // a ranks below b
		if a.d != b.d {
			return a.d < b.d
		}
		return a.id.k.rule > b.id.k.rule || (a.id.k.rule == b.id.k.rule && a.id.k.identity > b.id.k.identity)
	}
	h := make([]ranked, 0, min(n, len(c.all))) // a min-heap on less: h[0] ranks lowest
	for _, id := range c.all {
		x := ranked{id, demandOf(id)}
		if !(x.d > 0) {
			continue
		}
		switch {
		case len(h) < n:
			h = append(h, x)
			for i := len(h) - 1; i > 0 && less(h[i], h[(i-1)/2]); i = (i - 1) / 2 {
				h[i], h[(i-1)/2] = h[(i-1)/2], h[i]
			}
		case less(h[0], x):
			h[0] = x
			for i := 0; ; {
				m, l, r := i, 2*i+1, 2*i+2
				if l < len(h) && less(h[l], h[m]) {
					m = l
				}
				if r < len(h) && less(h[r], h[m]) {
					m = r
				}
				if m == i {
					break
				}
				h[i], h[m] = h[m], h[i]
				i = m
			}
		}
	}
	slices.SortFunc(h, func(a, b ranked) int {
		switch {
		case less(b, a):
			return -1
		case less(a, b):
			return 1
		}
		return 0
	})
	out := make([]TopIdentity, len(h))
	for i, x := range h {
		id := x.id
		out[i] = TopIdentity{Rule: id.k.rule, Identity: id.k.identity, Demand: x.d, IdentityState: IdentityState{
			Rate: id.rate, Default: slices.Clone(id.def), Published: slices.Clone(id.published(c.n)),
			Target: slices.Clone(id.target(c.n)), Smoothed: slices.Clone(id.st.Smoothed), Pending: id.pending,
			Version: id.pubVer,
		}}
	}
	return out
}

// regionBit is region r's bit in ident.moved; regions past 63 share the last one.
func regionBit(r int) uint64 { return 1 << min(r, 63) }
