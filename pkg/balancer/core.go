package balancer

import (
	"errors"
	"math"
	"sync"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/share"
)

// The Core's state and its life: what it holds per identity, enforcer and region,
// NewCore, a new leader's Restore, identities added and forgotten, and Published. Reports
// come in through Ingest (ingest.go); Tick (tick.go) recomputes the targets and steps the
// change plan (plan.go); Identity and Top (top.go) and Stats (stats.go) read it.

// Errors of Ingest and Restore. Every invalid report wraps ErrInvalidReport.
var (
	ErrInvalidReport = errors.New("balancer: invalid report")
	// ErrTooManyEnforcers: a report from an enforcer beyond MaxEnforcers in its region.
	ErrTooManyEnforcers = errors.New("balancer: too many enforcers in the region")
	// ErrRestoreLate: Restore after the core started (first Ingest or Tick) or twice.
	ErrRestoreLate = errors.New("balancer: restore after start")
)

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
	// Members, when set, are the enforcers the core counts for acknowledgements, changed
	// since the last Published ones: written (contract.MembersKey) before the set.
	Members    *contract.Members
	membersGen uint64
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
	// global is Limits.Global as of the last recompute (or newIdent), shared, never
	// modified: what a report's admitted count is believed up to (usage). A rule changed
	// since is read by the next recompute; until then its old limits bound the count.
	global   []bucket.Limit
	st       share.State
	vals     []float64
	hist     []histEntry  // earlier versions some region may still apply; nil when settled
	pubVer   uint64       // the version published took its value at
	lastSeen time.Time    // last report naming it (zero: since the core started)
	pending  bool         // in Core.pending
	evict    bool         // forget it once it is back at the default split
	shift    bool         // a report this window showed its traffic moved (Core.shifted)
	moved    uint64       // the regions whose reports showed it (bit min(r, 63))
	estSet   uint64       // the regions whose moveEst is set this window (bit r; r < 64)
	origin   int          // the region whose report added it (-1: restored), see Ingest
	born     time.Time    // when it began to arrive, read from the report that added it in this term (firstAge; zero: restored); see unseenCover.hold
	absent   uint64       // the regions (bit r, r < 64) hold has read as without it: not held again
	lifeOff  bool         // its windows read other than its life while young (lifeMoved): life is not read
	snapOf   uint64       // the Core.snapEpoch its snap values belong to (older: zero)
	arr      []arrivalSum // per region (Core.arrivedTogether); nil until a report refused it
	// carried is, per region, the bits (enforcerBit) of the enforcers whose own reports
	// carried traffic of the identity in the window carriedWin [2r] and the one before
	// [2r+1] (windows of one Interval since the Unix epoch); nil until such a report.
	carried    []uint64
	carriedWin int64
}

func (id *ident) published(n int) []float64 { return id.vals[:n:n] }

// smoothedAt is the policy's smoothed demand of region r, 0 before the identity's first
// recompute (or where the region was never heard).
func (id *ident) smoothedAt(r int) float64 {
	if r < len(id.st.Smoothed) && !math.IsNaN(id.st.Smoothed[r]) {
		return id.st.Smoothed[r]
	}
	return 0
}
func (id *ident) target(n int) []float64 { return id.vals[n : 2*n : 2*n] }
func (id *ident) tokens(n int) []float64 { return id.vals[2*n : 3*n : 3*n] }

// recent is Σ over this window's reports of the recent rates (tokens/s over about the
// last second, IdentityUsage.recent_rate) they carried for the identity.
func (id *ident) recent(n int) []float64 { return id.vals[3*n : 4*n : 4*n] }

// snap is Σ of the recent rates carried for the identity by the reports received since
// the last new version (Core.snapEpoch), valid while snapOf is the core's epoch: after a
// version every enforcer reports within its AckGap, so this is a fresh second of every
// region's traffic (see followUp).
func (id *ident) snap(n int, epoch uint64) []float64 {
	s := id.vals[4*n : 5*n : 5*n]
	if id.snapOf != epoch {
		clear(s)
		id.snapOf = epoch
	}
	return s
}

// moveEst is, per region, the region's rate as read from the last report this window
// whose recent rates showed the identity's traffic moved there or away (Core.shifted:
// that enforcer's recent rate × the region's live enforcers), where ident.estSet has the
// region's bit (regions past 63 have none). The recompute
// reads a moved region from it: the mean of the window's recent rates still holds the
// reports from before the move (a 50/s key whose 15/s in a region became 60/s was read
// at 21.8, and held 11 s at a 50/50 split).
func (id *ident) moveEst(n int) []float64 { return id.vals[5*n : 6*n : 6*n] }

// life is, per region, the tokens of the reports since the identity appeared, while it
// is young (YoungFor): its demand is read from all of them, not from the window since the
// last recompute (see recompute).
func (id *ident) life(n int) []float64 { return id.vals[6*n : 7*n : 7*n] }

// valsPer is the float64s of vals per region.
const valsPer = 7

type enforcerState struct {
	maxSeq     uint64
	bits       uint64 // bit d: seq maxSeq-d was seen
	lastHeard  time.Time
	appliedRev int64
	appliedVer uint64
	window     uint64 // the window it last reported in
	lastEndMs  int64  // the end of its last report's interval (Ingest counts seconds from it)
	snapOf     uint64 // the Core.snapEpoch it last reported in
	// markedAt, markLast: when a region-mate's report first and last showed its mark as
	// cut off alone in the region's store (fenceMarks); zero if none since its last report.
	// markSeq: the highest seq those marks named (the last report it had sent then).
	markedAt, markLast time.Time
	markSeq            uint64
	// restored: known only from the persisted Members (RestoreMembers), not heard in this
	// term. It is held as if it applied nothing of ours until it reports or has fenced
	// itself, and it is not counted among the enforcers sharing the region's traffic.
	restored bool
}

// live reports whether e shares its region's traffic now: heard in this term within
// silentAfter.
func (e *enforcerState) live(now time.Time, silentAfter time.Duration) bool {
	return !e.restored && now.Sub(e.lastHeard) <= silentAfter
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

// releasedEnf is an enforcer acks stopped waiting for on its mark as cut off alone.
type releasedEnf struct {
	ver  uint64    // the version of ours it had applied when released (mapApplied)
	seen time.Time // when a report last listed its mark
	// The seq its mark named (the last report it had sent when it fenced itself): an
	// aggregator's forward lists it by an earlier or the same one until it forgets it
	// (Member.seq); a later one is a word from it again.
	seq uint64
}

type regionState struct {
	name      string
	enforcers map[string]*enforcerState
	// aggregators: the region's report aggregators heard (only their seq is used, to
	// count a retry once); nil until one reports. Their members are in enforcers.
	aggregators map[string]*enforcerState
	lastHeard   time.Time
	heard       bool // since the core started (learning)
	winSecs     float64
	winEnfs     int
	winReports  int // reports this window (recent rates are summed over them)
	winRecent   int // of which measured recent rates (an older enforcer's do not)
	owned       int // identities its reports added that are still tracked (ident.origin)
	// fencedUntil: an enforcer of the region fenced itself (see acks) and may enforce up
	// to its default split until then; the region keeps that much reserved.
	fencedUntil time.Time
	// released: the enforcers acks stopped waiting for on their marks as cut off alone
	// (nil until one is): each enforces at most min(its share, default) of the versions
	// from the one it had applied, for as long as it is marked (mayApply).
	released map[string]*releasedEnf
	reports  uint64
	lag      time.Duration
	driftSum float64
	driftMax float64
	// The reports since the last new version (valid while snapOf is Core.snapEpoch): how
	// many, how many carried recent rates, and from how many enforcers.
	snapOf      uint64
	snapReports int
	snapEnfs    int
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
	quotas  *quotaBook // its own lock: answered without mu
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
	settleAt      time.Time // when a settle recompute is due (zero: none), see SettleAfter
	lastCompute   time.Time
	fullStep      bool // a recompute's targets wait for the next advance over every identity
	shiftStep     bool // that recompute was asked for by a shift: no MinVersionGap
	lastVersionAt time.Time
	versionsAt    [quickSteps]time.Time // when the last quickSteps versions were made, a ring (NextTick)
	versionsNext  int
	shiftPending  bool // a report's recent rates showed a key's traffic moved (shifted)
	window        uint64
	// snapEpoch counts new versions: the reports after one make a fresh snapshot of every
	// region's recent rates (ident.snap). followUp: the last version came from a recompute,
	// so once every region's enforcers have answered it (or EarlyGap passed) the core
	// recomputes once more, reading a region's demand from that snapshot where it differs
	// from the window's average by more than its noise (followUpRecompute).
	snapEpoch uint64
	followUp  bool
	// followHeld: a follow-up was pending when the last recompute began; if that
	// recompute's step changes nothing, it stays pending (Tick).
	followHeld bool
	snapUsed   int  // identities the last recompute read from the snapshot
	snapMoves  int  // of which moves (the policy's fast path)
	asked      bool // the last recompute but follow-ups was asked for by a report, not the interval
	// followDepth counts the follow-ups since the last recompute (at most MaxFollowUps).
	followDepth int

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
	// relAck[r], relAny[r]: region r has released enforcers (regionState.released), the
	// oldest version of ours one of them had applied.
	relAck []uint64
	relAny []bool
	relBuf []float64 // mayApply's scratch
	// rankBuf is capPublished's and capTracked's scratch (one recompute at a time).
	rankBuf []ranked
	// membersGen counts changes to the regions' enforcer tables (members.go); membersSent
	// is the count the last Published Members carried.
	membersGen, membersSent uint64
}

type counters struct {
	recomputes, followUps, settles, duplicates, invalid, unknownRule, dropped, evicted, clamped uint64
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
		relAck: make([]uint64, n), relAny: make([]bool, n), relBuf: make([]float64, n),
		membersGen: 1, // a term's first publication writes its members, even none
	}
	c.quotas = newQuotaBook(c.weights, cfg.SilentAfter, cfg.MaxQuotaEntries)
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
	for r := range c.regions {
		for _, e := range c.regions[r].enforcers {
			if e.restored && e.lastHeard.IsZero() {
				e.lastHeard = now // heard by the old leader at the latest now: its fence counts from here
			}
		}
	}
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
		id, ok := c.newIdent(e.Rule, e.Identity)
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

// newIdent builds an identity at the default split; ok is false for an unknown rule.
func (c *Core) newIdent(rule, identity string) (*ident, bool) {
	l, ok := c.cfg.Limits(rule, identity)
	rate, def := l.Rate, l.Default
	if !ok || !(rate > 0) || math.IsInf(rate, 0) || (def != nil && len(def) != c.n) {
		c.stats.unknownRule++
		return nil, false
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
	id.born, id.absent, id.lifeOff = time.Time{}, 0, false
	clear(id.life(c.n))
	id.global = l.Global
	copy(id.published(c.n), def)
	copy(id.target(c.n), def)
	c.ids[id.k] = id
	c.all = append(c.all, id)
	return id, true
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
	if p.Members != nil {
		c.membersSent = max(c.membersSent, p.membersGen)
	}
}

// progress is how many recomputes the core made, and the identities it tracks and whose
// change plan is not finished (for the service's timing and spans).
func (c *Core) progress() (recomputes uint64, tracked, pending int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats.recomputes, len(c.ids), len(c.pending)
}
