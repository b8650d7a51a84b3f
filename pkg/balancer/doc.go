// Package balancer is the quota balancer: it merges the enforcers' usage reports, moves
// each region's share of every limited identity's global limit toward where that
// identity's traffic is (pkg/share decides how much), and publishes the shares that differ
// from the default split (pkg/contract's format) through a change plan that keeps the sum
// over regions ≤ 1 at every instant, also while a change is being applied.
//
// # The core
//
// Core is the whole decision: synchronous, no goroutines, no I/O, the time passed in, one
// mutex. The service around it (Service: etcd election, fenced publisher, gRPC report
// server) and regionsim (a virtual clock) drive it the same way:
//
//	Ingest(now, report)   a report: validated whole, deduped by (region, enforcer, seq)
//	Tick(now)             every second or so: a Publication to write, or nil
//	Published(p, now)     that write landed
//	Restore(head, entries) a new leader's starting point: the persisted set
//
// # Demand
//
// Per recompute window (from one recompute to the next) the core sums, per identity and
// per region, the tokens (admitted + refused) of every report from that region's
// enforcers, and the seconds each report covers. Region r's demand for identity i is
//
//	demand_r(i) = tokens_r(i) / D_r,   D_r = (Σ seconds covered by r's reports) / (r's enforcers that reported)
//
// which is exact when the enforcers of a region report over equal intervals (they do: same
// period) and errs under by the part of an enforcer that did not report in the window. A
// region with no report in the window has demand NaN (share.Input: not heard; its smoothed
// demand stands); an identity absent from a region's reports has demand 0 there. An
// identity first named less than YoungFor ago, whose traffic has not moved, is read over
// its life instead: its tokens since it appeared (dated from the report that first named
// it, firstAge) over the seconds its regions' reports cover since then (docs/design.md §9,
// "A key before the balancer knows it").
//
// # The change plan
//
// Every published version is kept, per identity, until every region is known to have moved
// past it. mayApply_r(i) is the largest share of i for region r among the versions r may
// still be applying: the one its enforcers acknowledged and every later one. A region
// acknowledges version v when every enforcer of it that has not fenced itself (heard in
// the last Stale + AckTimeout, not shown by a region-mate's report marked fenced in their
// store naming the last report of it accepted for AckTimeout — an enforcer cut off alone
// fences itself within a few intervals and marks itself so: fence_marks, fenceMarks — and
// not gone with a final report) reports applying ≥ v (its
// share_version under this leader's fencing token); only reports acknowledge, never time
// (see acks). A fenced enforcer enforces at most min(its share, default), so its region
// keeps its default share reserved while the enforcer is remembered (another Stale) and,
// after that, while its region's reports count it marked fenced in their store (it marks
// itself for as long as it serves cut off: fenced_seen, pkg/bucket.Fences), and a
// region gone quiet for Stale + AckTimeout is taken to enforce at most the default split
// (see below). A new leader takes a region that has not acknowledged the version it
// restored to apply up to 1: it does not know the old leader's earlier versions. share.Step(mayApply, target) then returns the next shares to publish: decreases
// at once, increases only when Σ_q max(mayApply_q, next_q) ≤ 1, so whatever mix of old
// and new versions the regions apply, the shares in force sum to ≤ 1.
//
// Worked example: an identity at the default split (1/3, 1/3, 1/3) whose traffic is all in
// us-east gets the target (0.98, 0.01, 0.01). Version v publishes only the decreases,
// (1/3, 0.01, 0.01): any region may apply v or v−1, and the largest shares sum to 1/3 +
// 1/3 + 1/3 = 1. Once eu-west and ap-south report applying ≥ v, mayApply = (1/3, 0.01,
// 0.01) and version v' raises us-east to 0.98: 0.98 + 0.01 + 0.01 = 1 whatever us-east
// applies. us-east was held at 1/3 of the limit (under, never over) for about one report
// interval, or a share set's propagation and an early report.
//
// Enforcers report as soon as they apply a new set (report.ReporterConfig.SharesChanged, at
// least AckGap after their last report), so the acknowledgement an increase waits for
// takes about the watch's delay plus a report's round trip, not an interval. An enforcer
// that died mid-plan holds the increase back until it has fenced itself (Stale +
// AckTimeout) unless it left with a final report: under, never over.
//
// # Silence and staleness
//
// A region not heard for SilentAfter is held (share.Input.Held) at its last published
// share: the others' targets get no more than the rest (and while it may still apply an
// older, larger share, the plan keeps their increases back). After Stale it is held at
// min(last, default_r), which is what its enforcers enforce on their own after Stale
// without a fresh head or, with usage reports, without an accepted report (pkg/enforcer/overrides).
// Stale + AckTimeout after its last report (AckTimeout covering the round trip from which
// its enforcers count) the region is gone: every enforcer of it enforces at most
// min(its share, default), so the plan reserves the default share for it and hands the
// rest to the others — a region down for good gives its share back one staleness period
// (plus AckTimeout) after it fell silent, and had it only been cut off, no mix of what
// the regions apply sums above 1.
//
// # Bounds
//
// Reports hold at most MaxEntries identities; at most MaxIdentities are tracked (the least
// demanded are evicted: back to the default split through the plan, then forgotten); a
// publication lists at most MaxPublished (the least demanded of the rest go back to the
// default split), so the bytes written per version are bounded whatever the key count;
// a new version comes at most every MinVersionGap, so the bytes per interval are too.
// Identities absent from every report for KeyTTL go back to the default split, never to 0.
package balancer
