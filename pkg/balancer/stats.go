package balancer

import (
	"time"
)

// RegionStats is one region as the core sees it.
type RegionStats struct {
	Region    string
	Reports   uint64        // reports accepted (duplicates and invalid ones not counted)
	Enforcers int           // enforcers tracked (heard within Stale)
	LastHeard time.Time     // last report (zero: never)
	Lag       time.Duration // the last report's arrival − its interval end
	Acked     uint64        // the version the region is known to have moved to
	// ShareAge is how old the region's acknowledged set is: now − when the version after
	// it landed (it stopped being current then), or now − the last head refresh while it
	// is current.
	ShareAge      time.Duration
	Silent, Stale bool
	// Fenced: an enforcer of the region fenced itself (cut off from the control plane)
	// and may still enforce up to its default share — remembered for Stale past its
	// fence, or counted by its region's reports (fenced_seen), or released on its mark as
	// cut off alone and still marked — so the region keeps that reserved (see acks).
	Fenced             bool
	DriftSum, DriftMax float64 // Σ and max over identities of |published − demand fraction|, last recompute
}

// Stats is a snapshot of the core's counters, for metrics and tests.
type Stats struct {
	LeaderRev       int64
	Version, Landed uint64
	Learning        bool
	Tracked, Listed int // identities tracked; listed in the version in force
	Pending         int // identities whose change plan is not finished
	Recomputes      uint64
	FollowUps       uint64 // recomputes of the identities a version's answers showed moved (Core.followUp)
	Settles         uint64 // recomputes SettleAfter after a move's (Core.settleAt), also in Recomputes
	Duplicates      uint64 // retried reports ignored
	Invalid         uint64 // reports refused
	UnknownRule     uint64 // usage entries whose rule is unknown, ignored
	Dropped         uint64 // new identities dropped past MaxIdentities + 1/8
	Evicted         uint64 // identities forgotten (KeyTTL, cap, rule gone)
	Clamped         uint64 // usage entries whose admitted count was above Limits.MaxAdmitted
	Quotas          int    // calendar quotas whose counts the leader keeps
	QuotaRefused    uint64 // quota counts not kept: the book was full (MaxQuotaEntries)
	Regions         []RegionStats
}

// Newest returns the newest share set the core has made: its fencing token and version
// (0 before the first). An enforcer that fenced itself as cut off alone rejoins only once
// it applies that one or a newer one (ReportResponse.share_version).
func (c *Core) Newest() (leaderRev int64, version uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.version == 0 {
		return 0, 0
	}
	return c.cfg.LeaderRev, c.version
}

// Stats returns the counters at now.
func (c *Core) Stats(now time.Time) Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := Stats{
		LeaderRev: c.cfg.LeaderRev, Version: c.version, Landed: c.landed, Learning: c.learning,
		Tracked: len(c.ids), Listed: c.listed, Pending: len(c.pending),
		Recomputes: c.stats.recomputes, FollowUps: c.stats.followUps, Settles: c.stats.settles, Duplicates: c.stats.duplicates, Invalid: c.stats.invalid,
		UnknownRule: c.stats.unknownRule, Dropped: c.stats.dropped, Evicted: c.stats.evicted, Clamped: c.stats.clamped,
	}
	s.Quotas, s.QuotaRefused = c.quotas.stats()
	ack := c.acks(now)
	for r := range c.regions {
		rs := &c.regions[r]
		last := rs.lastHeard
		if last.IsZero() || last.Before(c.start) {
			last = c.start
		}
		age := now.Sub(c.lastHeadAt)
		for _, l := range c.log {
			if l.v > ack[r] && !l.landed.IsZero() {
				age = now.Sub(l.landed)
				break
			}
		}
		if c.lastHeadAt.IsZero() {
			age = 0
		}
		s.Regions = append(s.Regions, RegionStats{
			Region: rs.name, Reports: rs.reports, Enforcers: len(rs.enforcers), LastHeard: rs.lastHeard,
			Lag: rs.lag, Acked: ack[r], ShareAge: age,
			Silent: now.Sub(last) > c.cfg.SilentAfter, Stale: now.Sub(last) >= c.cfg.Stale, Fenced: c.fenced[r] || c.relAny[r],
			DriftSum: rs.driftSum, DriftMax: rs.driftMax,
		})
	}
	return s
}
