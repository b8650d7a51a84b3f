package balancer

import (
	"fmt"
	"math"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

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
	e.markedAt, e.markLast, e.markSeq = time.Time{}, time.Time{}, 0
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
	c.usage(now, ri, r, secs, 1, recent)
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
// they cover (the bound on what may have been admitted), reports the enforcer reports they
// merge, recent those of them with recent rates (a shift is judged on their mean). Called
// with c.mu held.
func (c *Core) usage(now time.Time, ri int, r *allotv1.ReportRequest, secs float64, reports, recent int) {
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
			id.origin, id.born = ri, now.Add(-firstAge(u, secs, reports, recent))
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
		if id.young(now) && !id.lifeOff {
			id.life(c.n)[ri] += admitted + u.Refused
		}
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

// firstAge is how long the identity had been arriving when the report that first names it
// was sent: the window's tokens at the recent rate, at most the window. A key that
// appeared late in a long window — every key at a new deployment's start, whose
// enforcers' first windows are mostly the time before it — has a recent rate well above
// its window's average, and its age is the part of the window it was there for; without
// a recent rate it is taken to have been there the whole window. unseenCover.hold counts
// the other regions' reports from then: the part of their windows before it proves
// nothing (their first windows, read as without it, held a 3/s key used from two regions
// at nothing in one of them for 16 s). Which way it errs: a recent second that happened
// to be busy makes a key look younger, and the other regions are held a report longer.
func firstAge(u *allotv1.IdentityUsage, secs float64, reports, recent int) time.Duration {
	win := secs / float64(max(reports, 1))
	age := win
	if recent > 0 && u.RecentRate > 0 {
		age = min(age, (u.Admitted+u.Refused)/float64(max(reports, 1))/(u.RecentRate/float64(recent)))
	}
	return time.Duration(max(age, 0) * float64(time.Second))
}
