package balancer

import (
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// What reports say of the region's fenced enforcers (pkg/bucket.Fences): how many are
// marked in the region's store (fenced_seen, the region-wide reservation: heardRegion) and
// the newest marks (fence_marks: fenceMarks here, then acks and mayApply in plan.go).

// fenceHold is how long a report that saw a fenced enforcer of its region (fenced_seen)
// keeps the region's default share reserved: 2 × SilentAfter (40 s by default), four
// report intervals of each of its enforcers, so one lost report or store call does not
// release it while the fenced enforcer serves. A fenced enforcer takes its mark back at
// its first report once heard again (or its mark lapses three intervals after a crash), so
// the reservation ends about a minute after it does.
func (c *Core) fenceHold() time.Duration { return 2 * c.cfg.SilentAfter }

// MaxFencedSeen bounds ReportRequest.fenced_seen: the most fenced enforcers a region's
// store keeps marks of (pkg/bucket.MaxFences).
const MaxFencedSeen = 4096

// fenceMarks notes, from a report of an enforcer of region rs, the enforcers of the region
// that marked themselves fenced in its store as cut off alone (ReportRequest.fence_marks,
// a mark naming a seq, the last report it had sent when it marked itself): such an
// enforcer fenced itself before it marked itself and rejoins only after taking its mark
// back, once a report of it sent after the mark has been accepted. A mark is believed of
// an enforcer silent for SilentAfter when no report of it this leader accepted is later
// than the one it names — so every report the leader took was sent before the fence,
// whether or not its answer got back (the cut fell between) — or, for one this term has
// not heard (restored from the members), any seq: a report of it accepted since its mark
// would have been accepted by this leader, which would have heard it. acks stops waiting for it
// once the mark has been seen for AckTimeout — in a report received AckTimeout or more
// after the first that showed it, so the enforcer was still marked, hence fenced, then
// (a report built before it took its mark back and delivered late is not enough). seen
// is when the marks were read: now for an enforcer's own report; for an aggregator's
// forward, when it received the member report that carried them (fence_marks_ago_ms
// before now), so a list the aggregator forwards again counts no later. Behind an
// aggregator, the last report of an enforcer accepted is the highest seq a forward listed
// (Member.seq), and the enforcer marks itself with the last seq it sent the aggregator.
// Called with c.mu held.
//
// A mark is believed as much as the report that carries it: a holder of the region's
// certificate could as well send reports in the marked enforcer's name acknowledging
// any version.
//
// It returns how many of the marks it was told of name an enforcer it accounts for
// without the region-wide reservation: one still waited for (its acknowledgement holds
// the region at what it may apply) or one released (its versions are reserved up to its
// default, mayApply). The rest are held by fenced_seen (heardRegion).
func (c *Core) fenceMarks(seen time.Time, rs *regionState, r *allotv1.ReportRequest) (explained uint32) {
	for _, m := range r.FenceMarks {
		found := false
		for name, x := range rs.released {
			if bucket.SightID(name) == m.Enforcer {
				x.seen, found = later(x.seen, seen), true
			}
		}
		for name, e := range rs.enforcers {
			if bucket.SightID(name) != m.Enforcer {
				continue
			}
			found = true
			// A stale enforcer's mark names no seq: ended by a set read again, not by a
			// report.
			if m.Seq == 0 || !e.restored && e.maxSeq > m.Seq || seen.Sub(e.lastHeard) < c.cfg.SilentAfter {
				continue
			}
			if e.markedAt.IsZero() {
				e.markedAt = seen
			}
			e.markLast = later(e.markLast, seen)
			e.markSeq = max(e.markSeq, m.Seq)
		}
		if found {
			explained++
		}
	}
	return explained
}
