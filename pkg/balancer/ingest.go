package balancer

import (
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/bits"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// Reports in: Ingest checks a report whole (validate) and against what can be true
// (claims), counts it once per enforcer and seq, and adds its tokens and recent rates to
// the window's demand; shifted says whether it shows a key's traffic moved, which asks
// for a recompute at once.

// MaxNameLen bounds a report's rule id, identity and enforcer id (bytes).
const MaxNameLen = 512

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
	case r.FencedSeen > MaxFencedSeen:
		return bad("fenced_seen %d, more than %d", r.FencedSeen, MaxFencedSeen)
	case len(r.FenceMarks) > bucket.MaxFenceMarks:
		return bad("%d fence_marks, more than %d", len(r.FenceMarks), bucket.MaxFenceMarks)
	case r.FenceMarksAgoMs < 0 || r.FenceMarksAgoMs > 0 && len(r.Members) == 0:
		return bad("fence_marks_ago_ms %d: must be >= 0, and only an aggregator's report (with members) says it", r.FenceMarksAgoMs)
	}
	for i, m := range r.FenceMarks {
		if m == nil || m.Enforcer == "" || len(m.Enforcer) > bucket.MaxSightLen {
			return bad("fence_marks[%d]: enforcer %.64q: empty or longer than %d bytes", i, m.GetEnforcer(), bucket.MaxSightLen)
		}
	}
	if err := validateQuotas(r.Quotas, c.cfg.MaxEntries); err != nil {
		return 0, err
	}
	if err := validateMembers(r, c.cfg.MaxEnforcers); err != nil {
		return 0, err
	}
	for i, u := range r.Usage {
		switch {
		case u == nil:
			return bad("usage[%d] is nil", i)
		case u.Rule == "" || u.Identity == "" || len(u.Rule) > MaxNameLen || len(u.Identity) > MaxNameLen:
			return bad("usage[%d]: rule %.64q identity %.64q: empty or longer than %d bytes", i, u.Rule, u.Identity, MaxNameLen)
		case !count(u.Admitted) || !count(u.Refused) || !count(u.Error) || !count(u.RegionalRate) || !count(u.RecentRate) || !count(u.RecentTokens):
			return bad("usage[%d] (%s %s): admitted %g refused %g error %g regional_rate %g recent_rate %g recent_tokens %g: must be finite and >= 0",
				i, u.Rule, u.Identity, u.Admitted, u.Refused, u.Error, u.RegionalRate, u.RecentRate, u.RecentTokens)
		}
	}
	return ri, nil
}

// membersHeard is when the latest of an aggregator's members was heard (now for an
// enforcer's own report).
func membersHeard(now time.Time, r *allotv1.ReportRequest) time.Time {
	if len(r.Members) == 0 {
		return now
	}
	ago := r.Members[0].HeardAgoMs
	for _, m := range r.Members[1:] {
		ago = min(ago, m.HeardAgoMs)
	}
	return now.Add(-time.Duration(max(ago, 0)) * time.Millisecond)
}

// validateMembers checks an aggregator's member list (ReportRequest.members).
func validateMembers(r *allotv1.ReportRequest, maxMembers int) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidReport}, a...)...)
	}
	if len(r.Members) > maxMembers {
		return bad("%d members, more than %d", len(r.Members), maxMembers)
	}
	if len(r.Members) == 0 {
		return nil
	}
	if r.Final {
		return bad("an aggregator's report (with members) says final: only a member leaves")
	}
	seen := make(map[string]struct{}, len(r.Members))
	for i, m := range r.Members {
		switch {
		case m == nil:
			return bad("members[%d] is nil", i)
		case m.EnforcerId == "" || len(m.EnforcerId) > MaxNameLen:
			return bad("members[%d]: enforcer_id %.64q: empty or longer than %d bytes", i, m.EnforcerId, MaxNameLen)
		case m.HeardAgoMs < 0 || m.CoveredMs < 0:
			return bad("members[%d] (%.64s): heard_ago_ms %d covered_ms %d: must be >= 0", i, m.EnforcerId, m.HeardAgoMs, m.CoveredMs)
		case m.RecentReports > m.Reports:
			return bad("members[%d] (%.64s): recent_reports %d, more than its reports %d", i, m.EnforcerId, m.RecentReports, m.Reports)
		}
		if _, dup := seen[m.EnforcerId]; dup {
			return bad("members[%d]: enforcer_id %.64q listed twice", i, m.EnforcerId)
		}
		seen[m.EnforcerId] = struct{}{}
	}
	return nil
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

// Ingest records one enforcer's report, or a region aggregator's merge of its enforcers'
// reports (ReportRequest.members, see ingestMembers). A malformed report (unknown region,
// empty enforcer id, a negative or non-finite count, more than MaxEntries entries, an empty
// interval, a bad member) is refused whole with an error wrapping ErrInvalidReport and
// changes nothing; a retry of a report already counted (same region, enforcer id and seq)
// returns nil and changes nothing. Identities whose rule LimitsFunc does not know are
// skipped and counted.
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
	if rs.snapOf != c.snapEpoch { // the first report since the last new version
		rs.snapOf, rs.snapReports, rs.snapEnfs = c.snapEpoch, 0, 0
	}
	if len(r.Members) > 0 {
		return c.ingestMembers(now, ri, r)
	}
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
		c.membersGen++
	}
	e.seen(r.Seq)
	e.lastHeard, e.appliedRev, e.appliedVer, e.restored = now, r.ShareLeaderRev, r.ShareVersion, false
	// Heard: no mark of it before this report counts, and its acknowledgements count again.
	e.markedAt, e.markLast = time.Time{}, time.Time{}
	delete(rs.released, r.EnforcerId)
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
	e.lastEndMs = max(e.lastEndMs, r.IntervalEndMs)
	recent := 0
	if r.RecentWindowMs > 0 {
		recent = 1
		if e.snapOf != c.snapEpoch+1 { // offset by one so 0 means never
			e.snapOf = c.snapEpoch + 1
			rs.snapEnfs++
		}
	}
	c.heardRegion(now, now, rs, r, secs, 1, recent, c.fenceMarks(now, rs, r))
	if r.Final {
		// It stopped answering checks: it enforces nothing any more, so neither its
		// acknowledgements nor its fence are waited for (see acks).
		delete(rs.enforcers, r.EnforcerId)
		c.membersGen++
	}
	c.usage(now, ri, r, secs, recent)
	return nil
}

// heardRegion counts one report (reports enforcer reports merged, recent of them with
// recent rates, covering secs enforcer-seconds) in its region's window. Called with c.mu
// held.
//
// heard is when the region's latest word from an enforcer was: now for an enforcer's own
// report; for an aggregator's, its most recently heard member — the aggregator's forwards
// alone never make a region whose enforcers are all silent look alive (it is held, then
// gone, as if they had reported directly).
func (c *Core) heardRegion(now, heard time.Time, rs *regionState, r *allotv1.ReportRequest, secs float64, reports, recent int, explained uint32) {
	rs.winSecs += secs
	if heard.After(rs.lastHeard) {
		rs.lastHeard = heard
	}
	rs.heard = true
	rs.reports++
	rs.winReports += reports
	if recent > 0 {
		rs.winRecent += recent
		rs.snapReports += recent
	}
	rs.lag = now.Sub(time.UnixMilli(r.IntervalEndMs))
	if r.FencedSeen > explained {
		// An enforcer of this region fenced itself and still serves from its store (it
		// marks itself there at every report it tries; pkg/bucket.Fences): it enforces up
		// to its default share for as long as it serves, so the region keeps that reserved
		// (acks, clampGone) while reports see it — not only for Stale past its fence, after
		// which it was forgotten while still enforcing (applied shares summing to 1.32).
		// fenceHold past the last such report covers the gaps between them.
		rs.fencedUntil = later(rs.fencedUntil, now.Add(c.fenceHold()))
	}
	// A report flagged early (refusals jumped at that enforcer) asks for nothing by the
	// flag alone: its recent rates do, through the shift test (usage), when they show the
	// traffic moved. A recompute at every early report (EarlyGap) republished the noise of
	// keys near their shares: on 2,000 keys 8.1 versions a steady interval, 2.8 without,
	// and many-keys over seven seeds recovered moves no slower (issue 21 §3).
}

// usage adds a report's usage entries to the window's demand: secs is the enforcer-seconds
// they cover (the bound on what may have been admitted), recent the reports whose recent
// rates they sum (a shift is judged on their mean). Called with c.mu held.
func (c *Core) usage(now time.Time, ri int, r *allotv1.ReportRequest, secs float64, recent int) {
	rs := &c.regions[ri]
	hardCap := c.cfg.MaxIdentities + c.cfg.MaxIdentities/8
	// The enforcers that share the region's traffic now: those heard within SilentAfter
	// (a restarted region's old enforcers, silent until acknowledgements drop them,
	// doubled its estimate and read its steady traffic as arriving).
	live := 0
	for _, e := range rs.enforcers {
		if e.live(now, c.cfg.SilentAfter) {
			live++
		}
	}
	enfs := max(1, live)
	var bit uint64 // the reporting enforcer's (arrivedTogether); an aggregator's merge has none
	if len(r.Members) == 0 {
		bit = enforcerBit(r.EnforcerId)
	}
	for _, u := range r.Usage {
		k := key{u.Rule, u.Identity}
		id := c.ids[k]
		// A quiet entry (no tokens: its traffic stopped since the enforcer's last report)
		// says only that its recent rate fell: it tracks nothing new and keeps nothing alive.
		quiet := u.Admitted == 0 && u.Refused == 0
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
			var ok bool
			if id, ok = c.newIdent(u.Rule, u.Identity); !ok {
				continue
			}
			id.origin = ri
			rs.owned++
		}
		// Believed up to the limits the identity was last recomputed under (its rule is
		// looked up once a recompute, not once a report: a third of a leader's ingest time
		// at 10,000 identities).
		admitted := u.Admitted
		if m := (Limits{Global: id.global}).MaxAdmitted(secs); admitted > m {
			admitted = m
			c.stats.clamped++
		}
		id.tokens(c.n)[ri] += admitted + u.Refused
		id.recent(c.n)[ri] += u.RecentRate
		if recent > 0 {
			id.snap(c.n, c.snapEpoch)[ri] += u.RecentRate
		}
		if !quiet {
			id.lastSeen = now
			id.evict = false
		}
		spread := enfs
		if bit != 0 && !quiet {
			spread = c.spread(now, id, ri, bit, enfs)
		}
		if recent == 0 {
			continue
		}
		// Whether it arrived is judged over the enforcers that carry it (spread); how much
		// arrived, and whether it left, over all the region's: a key that was small in a
		// region and seen at one enforcer there, whose traffic then arrives over all of
		// them, is read at its rate, not a third of it (a third cost the 10,000-key
		// population half a version an interval in the rounds that corrected it).
		mean := u.RecentRate / float64(recent)
		var moved bool
		if len(r.Members) > 0 && recent > 1 {
			mean, moved = c.mergeShifted(id, ri, u, recent, enfs)
		} else {
			moved = c.shifted(id, ri, u.RecentRate, u.RecentTokens, u.Refused > 0, u.Draining, recent, spread, enfs)
		}
		if !moved {
			mean, moved = c.arrivedTogether(now, id, ri, bit, u.RecentRate, u.RecentTokens, u.Refused > 0, spread)
		}
		est := mean * float64(enfs)
		if moved {
			id.shift, c.shiftPending = true, true
			id.moved |= regionBit(ri)
			if ri < 64 {
				id.moveEst(c.n)[ri] = est
				id.estSet |= 1 << ri
			}
		}
	}
}

// spread is the enforcers of region r that see the identity's traffic, of its enfs live
// ones: those whose own reports carried traffic of it in this window or the last (see
// ident.carried), the reporting one (bit) included, which it records. The arrival tests
// (arrived, arrivedTogether) read a region's rate from one enforcer's as that rate times
// the enforcers that share it: times all enfs, a region whose gateways send a key's
// traffic to one of its two enforcers (a gateway pinned to one, or hashing by key) was
// read at twice its rate on every report, as an arrival, and a key over its limit in two
// such regions swung between them at every round of acknowledgements
// (TestTrafficOnOneEnforcerIsNotAMove). Where none carried it before this report (traffic
// new to the region) it is all enfs, as before.
//
// Which way it errs: toward "not arrived". A key spread over every enforcer but missing
// from some of their reports for two windows (a small key under their usage tables'
// thresholds) is judged from fewer enforcers than carry it, so its arrival is found later;
// bits that collide (a region of many enforcers) are counted back by linear counting and
// are at most enfs. Once an arrival is found, how much arrived is read over all enfs (see
// usage). Called with c.mu held; bit != 0 (an enforcer's own report).
func (c *Core) spread(now time.Time, id *ident, r int, bit uint64, enfs int) int {
	w := now.UnixNano() / int64(c.cfg.Interval)
	if id.carried == nil {
		id.carried, id.carriedWin = make([]uint64, 2*c.n), w
	}
	switch d := w - id.carriedWin; {
	case d == 1:
		for i := 0; i < len(id.carried); i += 2 {
			id.carried[i+1], id.carried[i] = id.carried[i], 0
		}
		id.carriedWin = w
	case d > 1:
		clear(id.carried)
		id.carriedWin = w
	case d < 0: // a report stamped before the last (clocks differ): read, not recorded
		return enfs
	}
	seen := id.carried[2*r] | id.carried[2*r+1]
	id.carried[2*r] |= bit
	if seen == 0 {
		return enfs
	}
	return min(enfs, bitsCounted(seen|bit))
}

// bitsCounted is how many distinct enforcers set the bits of mask (each one bit of 64 by
// a hash): the linear-counting estimate −64·ln(1 − set/64), at least the bits set, and
// unbounded when all 64 are.
func bitsCounted(mask uint64) int {
	set := bits.OnesCount64(mask)
	if set >= 64 {
		return math.MaxInt
	}
	return max(set, int(math.Round(-64*math.Log1p(-float64(set)/64))))
}

// The region-level arrival test (arrivedTogether): how far apart the reports it sums may
// come, and the fewest tokens the smoothed demand must bring in their spans.
const (
	arrivalSpan      = 2 * time.Second
	arrivalMinTokens = 4
)

// arrivedTogether is the arrival test of shifted on the region's reports rather than one
// enforcer's: the counts of the recent spans of the reports that distinct enforcers of
// region r sent within arrivalSpan (this one included; bit is its enforcer's, 0 for an
// aggregator's merged report, which is tested alone), against the tokens the smoothed
// demand brings in those spans, by the same shiftSigmas and shiftTokens and one token
// more for each report past the first. Each enforcer sees about a third of a
// three-enforcer region's traffic, so one report holds a third of the evidence: a 50/s
// key whose 15/s in a region became 60/s was counted 13, 10 and 14 tokens by three
// reports within 0.7 s (many-keys, seed 32), each under its own threshold of about 15,
// together over the 31 their sum asks for, and it waited 2 s more for a report that
// passed alone.
//
// Distinct enforcers only (a report from one already summed starts the sum again from
// it): two reports of one enforcer 0.5 s apart count the same tokens twice, which a
// Poisson test does not allow for. bit is a hash of the enforcer's name, so two
// enforcers of a region may share one; that only ends a sum early. Nor a sum the
// smoothed demand brings fewer than arrivalMinTokens to: a small key's counts are not the
// Poisson counts the test assumes (a pair's recent span can start at its first request, a
// token high, and a report that carries a refusal was sent as a burst was refused), and
// over the 10,000-key population 678 of the 798 sums that passed in the steady state
// expected under two tokens: the versions per interval doubled. Such keys keep the
// one-report test. The extra token a report answers the same bias in larger keys.
//
// Which way it errs: a false arrival is a little likelier than with one report's test
// (about twice as many tests); it returns the mean of the summed reports' rates (the
// caller reads the region's rate as that × its enforcers), which a report from before the
// move pulls low (under).
// Called with c.mu held.
func (c *Core) arrivedTogether(now time.Time, id *ident, r int, bit uint64, rate, tokens float64, refused bool, enfs int) (float64, bool) {
	if bit == 0 || !(id.rate > 0) || !(rate > 0) || !(tokens > 0) || !count(rate) || !count(tokens) {
		return 0, false
	}
	if id.arr == nil {
		if !refused {
			return 0, false // nothing arrives where nothing is refused: no state for it
		}
		id.arr = make([]arrivalSum, c.n)
	}
	a := &id.arr[r]
	if a.mask&bit != 0 || now.Sub(a.from) > arrivalSpan {
		*a = arrivalSum{from: now}
	}
	sm := id.smoothedAt(r)
	n := float64(enfs)
	span := recentSpan(rate, tokens)
	a.got += rate * span
	a.mu += max(sm, 1) / n * span
	a.rate += rate
	a.k++
	a.mask |= bit
	if a.k < 2 || !refused || a.mu < arrivalMinTokens {
		return 0, false
	}
	mean := a.rate / float64(a.k)
	if est := mean * n; est > sm && countArrived(a.got, a.mu, float64(a.k-1)) && c.aboveShare(id, r, est) { // a token more a report past the first
		*a = arrivalSum{}
		return mean, true
	}
	return 0, false
}

// arrivalSum is one identity's counts in one region for arrivedTogether.
type arrivalSum struct {
	got, mu float64 // tokens counted in the reports' recent spans; those the smoothed demand brings
	rate    float64 // Σ of the reports' recent rates
	k       int     // reports summed
	mask    uint64  // their enforcers' bits
	from    time.Time
}

// enforcerBit is the bit an enforcer's reports take in an arrivalSum: FNV-1a of its name,
// so a run's sums, like the rest of it, do not depend on the process.
func enforcerBit(id string) uint64 {
	h := fnv.New64a()
	io.WriteString(h, id) // a hash.Hash never fails a write
	return 1 << (h.Sum64() % 64)
}

// ingestMembers records a region aggregator's report (pkg/aggregator): each member as if
// it had reported itself — heard heard_ago_ms before now, applying the set it names, gone
// if final — so acknowledgements still come from every enforcer and a silent one is still
// held until it fenced itself; the usage as that of the members' reports it merges
// (Member.reports, covering Member.covered_ms each). The aggregator is not an enforcer
// (it enforces no share): it is not tracked as one, only its seq is deduplicated. Called
// with c.mu held, r validated.
func (c *Core) ingestMembers(now time.Time, ri int, r *allotv1.ReportRequest) error {
	rs := &c.regions[ri]
	if rs.aggregators == nil {
		rs.aggregators = map[string]*enforcerState{}
	}
	a := rs.aggregators[r.EnforcerId]
	if a != nil && a.dup(r.Seq) {
		c.stats.duplicates++
		return nil
	}
	if err := c.claims(now, r); err != nil {
		c.stats.invalid++
		return err
	}
	fresh := 0
	for _, m := range r.Members {
		if err := c.claims(now, &allotv1.ReportRequest{ShareLeaderRev: m.ShareLeaderRev, ShareVersion: m.ShareVersion, IntervalEndMs: r.IntervalEndMs}); err != nil {
			c.stats.invalid++
			return fmt.Errorf("member %.64q: %w", m.EnforcerId, err)
		}
		if rs.enforcers[m.EnforcerId] == nil && !m.Final {
			fresh++
		}
	}
	if len(rs.enforcers)+fresh > c.cfg.MaxEnforcers {
		c.acks(now)
	}
	if len(rs.enforcers)+fresh > c.cfg.MaxEnforcers || (a == nil && len(rs.aggregators) >= c.cfg.MaxEnforcers) {
		c.stats.invalid++
		return fmt.Errorf("%w: %s has %d, a report names %d more", ErrTooManyEnforcers, rs.name, len(rs.enforcers), fresh)
	}
	if a == nil {
		a = &enforcerState{}
		rs.aggregators[r.EnforcerId] = a
	}
	a.seen(r.Seq)
	a.lastHeard = now
	var secs float64
	reports, recent := 0, 0
	maxSecs := 2 * c.cfg.Interval.Seconds()
	for _, m := range r.Members {
		e := rs.enforcers[m.EnforcerId]
		heard := now.Add(-time.Duration(m.HeardAgoMs) * time.Millisecond)
		if e == nil {
			if m.Final || now.Sub(heard) >= c.cfg.Stale+c.cfg.AckTimeout {
				continue // gone, or fenced itself by now (acks dropped it): nothing to wait for
			}
			if x := rs.released[m.EnforcerId]; x != nil && m.Seq != 0 && m.Seq == x.seq {
				continue // released on its mark, and listed by the word it was released after
			}
			e = &enforcerState{}
			rs.enforcers[m.EnforcerId] = e
			c.membersGen++
			// Its record holds what it may apply again.
			delete(rs.released, m.EnforcerId)
		}
		if e.restored || !heard.Before(e.lastHeard) { // a later word than the last: an older one never rolls it back
			// A report of it not heard before (the same one listed again dates the same to
			// the millisecond only up to the delays of the forwards: the seq tells):
			// no mark of it before counts.
			word := e.restored || m.Seq == 0 || m.Seq != e.maxSeq
			e.lastHeard, e.appliedRev, e.appliedVer, e.restored = heard, m.ShareLeaderRev, m.ShareVersion, false
			if word {
				e.markedAt, e.markLast = time.Time{}, time.Time{}
				if m.Seq != 0 {
					e.maxSeq, e.bits = m.Seq, 1
				}
			}
		}
		if m.Reports > 0 {
			if e.window != c.window+1 {
				e.window = c.window + 1
				rs.winEnfs++
			}
			n := float64(m.Reports)
			secs += min(max(float64(m.CoveredMs)/1000, 0.1*n), maxSecs*n)
			reports += int(m.Reports)
		}
		if m.RecentReports > 0 {
			recent += int(m.RecentReports)
			if e.snapOf != c.snapEpoch+1 {
				e.snapOf = c.snapEpoch + 1
				rs.snapEnfs++
			}
		}
		if m.Final {
			delete(rs.enforcers, m.EnforcerId) // as for a final report of its own
			c.membersGen++
		}
	}
	marksAt := now.Add(-time.Duration(r.FenceMarksAgoMs) * time.Millisecond)
	c.heardRegion(now, membersHeard(now, r), rs, r, secs, reports, recent, c.fenceMarks(marksAt, rs, r))
	c.usage(now, ri, r, max(secs, 0.1), recent)
	return nil
}

// shifted says whether the recent rates of an identity in reports of region r (rate, the
// sum over `reports` reports — one, or an aggregator's merge of several — counting tokens
// in all; enfs enforcers in the region, spread of them carrying the key (Core.spread),
// which see about equal parts of its traffic) show
// its traffic moved. Such a report asks for a recompute at once (ShiftGap) whatever else
// it says — an acknowledgement of a decrease carries the region's new, lower rate — and
// that recompute reads the identity's demand from the recent rates (see recompute).
//
//   - Arrived: the region's rate, estimated as the mean rate × spread, is above its
//     smoothed demand and above its published share by more than the dead-band (traffic
//     arrived, and is refused), and the tokens counted are more than the smoothed demand
//     would bring in the span they were counted over by shiftSigmas standard deviations
//     of that Poisson count and shiftTokens more (under 1e-4 by chance at any rate; a
//     pair's first two requests in half a second never pass; at least one token is
//     taken as due, see countArrived). A swap of 60/s and 15/s of a 50/s key over three
//     enforcers moves 5/s to 20/s an enforcer: about 18 tokens where 4.5 were expected,
//     found in the first report after it (the old test, which asked for a doubled rate
//     and 10/s an enforcer beyond the noise, never found it: 6 to 15 s).
//     Or draining instead of refused: a key under its limit whose demand is established
//     (ident.established), reported by an enforcer that saw the region's bucket under
//     half its burst in the recent second (IdentityUsage.draining), is spending that
//     burst and is refused once it is spent; it moves on the first report that shows it
//     (a 100/s key's 48/12 swap into a region allowed 30/s spends half its burst 0.8 s
//     after it, and is refused from 1.7 s). The rate alone is not enough: over the
//     10,000-key population the test's rare false arrivals, read from every report of a
//     thousand keys of 10–100/s, took the versions a steady interval from 4.4 to 9.0.
//   - Without a count (an older enforcer), arrived: at least doubled, beyond 3 standard
//     deviations of the estimate (√(enfs × smoothed)) and 10 tokens a second an enforcer.
//   - Left: at most half the smoothed demand and below by more than a quarter dead-band,
//     beyond that noise and floor; read over all enfs (the carriers would read it lower).
func (c *Core) shifted(id *ident, r int, rate, tokens float64, refused, draining bool, reports, spread, enfs int) bool {
	return c.arrived(id, r, rate, tokens, refused, draining, reports, spread) || c.left(id, r, rate, tokens, reports, enfs)
}

// arrived is shifted's arrival test, the region's rate read as the mean rate × spread.
func (c *Core) arrived(id *ident, r int, rate, tokens float64, refused, draining bool, reports, enfs int) bool {
	if !(id.rate > 0) || !count(rate) || !count(tokens) || reports < 1 {
		return false
	}
	// Not recomputed yet (a key the balancer first hears of): its demand was nothing, and
	// traffic that arrived above its default share is a move like any other.
	sm := id.smoothedAt(r)
	n, k := float64(enfs), float64(reports)
	est := rate / k * n
	if tokens > 0 && rate > 0 {
		span := recentSpan(rate, tokens) // each report's; the count is the rate over it
		mu := max(sm, 1) / n * span * k  // the tokens the smoothed demand brings
		return (refused || draining && id.established()) && est > sm && countArrived(rate*span, mu, 0) && c.aboveShare(id, r, est)
	}
	noise := 3*math.Sqrt(n*max(sm, 1)) + 10*n
	return est >= 2*sm+noise && c.aboveShare(id, r, est) // judged by the rate alone
}

// left is shifted's test of traffic that left, the region's rate read as the mean rate ×
// enfs.
func (c *Core) left(id *ident, r int, rate, tokens float64, reports, enfs int) bool {
	if !(id.rate > 0) || !count(rate) || !count(tokens) || reports < 1 {
		return false
	}
	sm := id.smoothedAt(r)
	n := float64(enfs)
	est := rate / float64(reports) * n
	noise := 3*math.Sqrt(n*max(sm, 1)) + 10*n
	return est <= sm/2-noise && (sm-est)/id.rate >= c.cfg.Share.DeadBand/4
}

// established says whether id is under its limit with a demand the balancer has measured:
// its regions' smoothed demand sums to at least a quarter of its rate and less than all
// of it. Only then is a region's rate above its share read as an arrival before it is
// refused (shifted). Over its limit, a region at its share is the policy's cut, not a
// move; a key barely heard of has no split to move from, and its first second's counts
// are clumps (many-keys' key05, 15/s in ap-south, read at 40/s from 12 tokens in 0.6 s
// and held at 50/50 for 20 s when every key counted).
func (id *ident) established() bool {
	var sum float64
	for r := range id.st.Smoothed {
		sum += id.smoothedAt(r)
	}
	return sum >= id.rate/4 && sum < id.rate
}

// The arrival test's margin over the Poisson count the smoothed demand brings (shifted).
const (
	shiftSigmas = 4
	shiftTokens = 3
)

// countArrived is the arrival test on a count: got tokens counted where the smoothed
// demand brings mu, beyond shiftSigmas Poisson standard deviations, shiftTokens and
// extra; mu is taken as at least one token (eight counted, then): under one token due a
// count that starts at a request and is read because requests were refused is no Poisson
// count, and over 10,000 keys a rare key's clump of five requests in half a second passed
// every 10 s or so (docs/design.md §9). Which way it errs: a key of a few requests a
// second that really moves waits for the interval's recompute.
func countArrived(got, mu, extra float64) bool {
	mu = max(mu, 1)
	return got >= mu+shiftSigmas*math.Sqrt(mu)+shiftTokens+extra
}

// recentSpan is the span a recent rate was counted over (0.5–1 s at an enforcer), from
// the rate and its count: clamped, so a report claiming another span or a count its rate
// does not carry cannot move the arrival test past what an enforcer measures.
func recentSpan(rate, tokens float64) float64 { return min(max(tokens/rate, 0.5), 1) }

// aboveShare says whether est, a region's rate, is above its published share of id's
// limit by more than the dead-band: an arrival there is refused, and moves the shares.
func (c *Core) aboveShare(id *ident, r int, est float64) bool {
	return est/id.rate > id.published(c.n)[r]+c.cfg.Share.DeadBand
}

// regionBit is region r's bit in ident.moved; regions past 63 share the last one.
func regionBit(r int) uint64 { return 1 << min(r, 63) }

// mergeShifted is shifted for an aggregator's merge of several reports (reports > 1):
// the test the leader runs on several enforcers' reports together (arrivedTogether), not
// the one it runs on a report. A merge sums its reports' recent counts, and any report
// that refused the key or saw its region draining flags the whole; tested as one report,
// such sums passed where no report would have (a small key's few clumped requests at
// three enforcers, one of them refused), and through aggregators the 10,000-key
// population published four times as many versions an interval as directly (34 against
// 9). So the sum is an arrival only where a report refused the key (draining is one
// report's evidence, which the merge does not keep), the smoothed demand brings at least
// arrivalMinTokens in the reports' spans, and it passes the count test by a token more a
// report past the first; left reads the sum, as for any report. A forward of one report
// (an acknowledgement or an early report forwarded at once, most of a move's evidence) is
// that report, and shifted tests it as such.
//
// It returns the rate an enforcer sees (the merge's mean; the caller reads the region's
// as that × its enforcers). Which way it errs: toward "not arrived", so toward a move
// found later, never a share over: a report that would have passed alone may be diluted
// by the others in its merge (it waits for a report forwarded alone, or the interval's
// recompute); a merge's reports of one enforcer are summed as if of several; the reports
// counted are all the forward's, not only those that carry the key (both raise the
// tokens the sum must reach). Keeping the report that shows an arrival best alongside
// the sums (fields of IdentityUsage the leader tests alone) was tried: on the 10,000-key
// population it published 11.1 versions an interval instead of 8.3 (its rate is read
// over all the region's enforcers, where directly only those that carry the key count)
// and failed no fewer keys. Called with c.mu held.
func (c *Core) mergeShifted(id *ident, r int, u *allotv1.IdentityUsage, reports, enfs int) (float64, bool) {
	mean := u.RecentRate / float64(reports)
	return mean, c.arrivedSum(id, r, u.RecentRate, u.RecentTokens, u.Refused > 0, reports, enfs) || c.left(id, r, u.RecentRate, u.RecentTokens, reports, enfs)
}

// arrivedSum is arrivedTogether's test on the sum of several reports' recent counts that
// an aggregator's merge carries (mergeShifted): rate and tokens summed over reports.
func (c *Core) arrivedSum(id *ident, r int, rate, tokens float64, refused bool, reports, enfs int) bool {
	if !refused || !(id.rate > 0) || !(rate > 0) || !(tokens > 0) || !count(rate) || !count(tokens) {
		return false
	}
	sm := id.smoothedAt(r)
	n, k := float64(enfs), float64(reports)
	span := recentSpan(rate, tokens)
	mu := max(sm, 1) / n * span * k // the tokens the smoothed demand brings in their spans
	if mu < arrivalMinTokens {
		return false
	}
	est := rate / k * n
	return est > sm && countArrived(rate*span, mu, k-1) && c.aboveShare(id, r, est)
}
