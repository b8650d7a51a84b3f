package balancer

import (
	"fmt"
	"time"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// An aggregator's forward (ReportRequest.members, pkg/aggregator): its members checked and
// recorded each as if it had reported itself.

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
			if x := rs.released[m.EnforcerId]; x != nil && m.Seq != 0 && m.Seq <= x.seq {
				continue // released on its mark, and listed by a report it sent before the mark
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
				e.markedAt, e.markLast, e.markSeq = time.Time{}, time.Time{}, 0
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
	c.usage(now, ri, r, max(secs, 0.1), reports, recent)
	return nil
}
