package balancer

import (
	"fmt"
	"math"
	"sync"
	"time"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// Calendar quotas across regions (docs/design.md §8, "Calendar quotas").
//
// A quota ("10,000 a day") is global, and each region counts what it admits in its own
// Redis. The regions learn each other's counts through the leader: every report carries
// the region's count of each quota the enforcer is counting (ReportRequest.quotas), and
// the answer carries, for the same quotas, the other regions' counts summed
// (ReportResponse.quota_others). An enforcer admits while its region's count plus the
// others' stays under the quota. No etcd write: the counts live in the reports and
// answers, and a leader's book is rebuilt by its term's first reports.
//
// The book keeps, per (rule, limit, identity, period), the largest count each region has
// reported in this term (a period's count only grows, so the largest is the newest) and
// what each region was last told.
//
// Which way it errs:
//   - A region learns the others' counts one report later (an interval, 10 s): near
//     exhaustion the regions together admit over by up to the other regions' rates × (the
//     interval + the enforcers' flush), once a period.
//   - A silent region (no report from any of its enforcers for SilentAfter) is counted at
//     what it may still use on its own: its last count plus its isolated fraction (its
//     weight in the default split) of what was left when it last heard the others. The
//     enforcer holds itself to the same (report.QuotaView) once it hears no answer for as
//     long, so a cut-off region and the rest never both spend the remainder; over by what
//     it admitted between its last answer and the moment it held itself (its rate ×
//     SilentAfter at most).
//   - A new leader answers nothing until it has heard every region (or, with one silent,
//     for SilentAfter into its term): the enforcers keep what the previous leader told
//     them meanwhile, and never take a smaller count from a new term (under, by a silent
//     region's reservation when the new leader knows it is back). A count the book lacks
//     then (a quota only another enforcer of a region holds, not reported yet) arrives
//     with that enforcer's report: the same one-report lag as any new quota.
//   - An enforcer that has had no answer yet (just started) counts its region only: over
//     by the others' counts for its first report round at most, at its own rate.
//   - A full book (MaxQuotaEntries) first forgets the quotas no report named for
//     quotaForget, then takes no new ones: those go unanswered and their enforcers count
//     only their own region (over, by the others' counts, for those quotas only); counted
//     in Stats.QuotaRefused.

// quotaForget is how long a quota no report names stays in the book: longer than any
// enforcer keeps counting an idle one.
const quotaForget = time.Hour

type quotaKey struct {
	rule, limit, identity string
	period                int64
}

type quotaEntry struct {
	quota   int64
	count   []int64 // per region: the largest count reported this term
	told    []int64 // per region: the others' count it was last answered
	touched time.Time
}

// quotaBook is the leader's view of every region's quota counts in one term. Safe for
// concurrent use; the zero value is not usable (newQuotaBook).
type quotaBook struct {
	mu sync.Mutex // mu guards every field below

	n           int
	fraction    []float64 // per region: its weight in the default split
	silentAfter time.Duration
	max         int

	started bool
	start   time.Time
	heard   []time.Time // per region: its last report
	entries map[quotaKey]*quotaEntry
	swept   time.Time
	refused uint64
}

func newQuotaBook(weights []float64, silentAfter time.Duration, max int) *quotaBook {
	return &quotaBook{
		n: len(weights), fraction: append([]float64(nil), weights...), silentAfter: silentAfter, max: max,
		heard: make([]time.Time, len(weights)), entries: map[quotaKey]*quotaEntry{},
	}
}

// validateQuotas checks a report's quota counts (called by validate, before anything is
// recorded).
func validateQuotas(qs []*allotv1.QuotaCount, maxEntries int) error {
	if len(qs) > maxEntries {
		return fmt.Errorf("%w: %d quota counts, more than %d", ErrInvalidReport, len(qs), maxEntries)
	}
	for i, q := range qs {
		switch {
		case q == nil:
			return fmt.Errorf("%w: quotas[%d] is nil", ErrInvalidReport, i)
		case q.Rule == "" || q.Limit == "" || q.Identity == "" ||
			len(q.Rule) > MaxNameLen || len(q.Limit) > MaxNameLen || len(q.Identity) > MaxNameLen:
			return fmt.Errorf("%w: quotas[%d]: rule %.64q limit %.64q identity %.64q: empty or longer than %d bytes",
				ErrInvalidReport, i, q.Rule, q.Limit, q.Identity, MaxNameLen)
		case q.PeriodStartMs <= 0 || q.Quota < 0 || q.Count < 0:
			return fmt.Errorf("%w: quotas[%d] (%s %s %s): period_start_ms %d quota %d count %d: must be > 0, >= 0, >= 0",
				ErrInvalidReport, i, q.Rule, q.Limit, q.Identity, q.PeriodStartMs, q.Quota, q.Count)
		}
	}
	return nil
}

// answer records region ri's report of qs at now and returns, for each quota of qs, the
// other regions' counts summed (a silent region counted at what it may still use). ok is
// false while the book is warming up (until every region has reported in this term, or
// SilentAfter passed): then nothing is answered and the enforcer keeps what it knew.
func (b *quotaBook) answer(now, heard time.Time, ri int, qs []*allotv1.QuotaCount) (others []*allotv1.QuotaCount, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.started {
		b.started, b.start, b.swept = true, now, now
	}
	if heard.After(b.heard[ri]) {
		b.heard[ri] = heard // an aggregator's forward: its latest member's (membersHeard)
	}
	if now.Sub(b.swept) >= b.silentAfter {
		b.sweep(now)
	}
	ok = now.Sub(b.start) >= b.silentAfter
	if !ok {
		ok = true // every region heard in this term: each count the book lacks is new
		for r := range b.n {
			ok = ok && !b.heard[r].IsZero()
		}
	}
	if ok {
		others = make([]*allotv1.QuotaCount, 0, len(qs))
	}
	for _, q := range qs {
		k := quotaKey{q.Rule, q.Limit, q.Identity, q.PeriodStartMs}
		e := b.entries[k]
		if e == nil {
			if len(b.entries) >= b.max {
				b.sweep(now)
			}
			if len(b.entries) >= b.max {
				b.refused++
				continue
			}
			e = &quotaEntry{count: make([]int64, b.n), told: make([]int64, b.n)}
			b.entries[k] = e
		}
		e.quota, e.touched = q.Quota, now
		e.count[ri] = max(e.count[ri], q.Count)
		if !ok {
			continue
		}
		sum := int64(0)
		for r := range b.n {
			if r != ri {
				sum += b.counted(now, e, r)
			}
		}
		e.told[ri] = sum
		others = append(others, &allotv1.QuotaCount{Rule: q.Rule, Limit: q.Limit, Identity: q.Identity,
			PeriodStartMs: q.PeriodStartMs, Quota: q.Quota, Count: sum})
	}
	return others, ok
}

// counted is what region r counts for in e: its count, or for a silent region its count
// plus its fraction of what was left when it was last answered (rounded up: under).
func (b *quotaBook) counted(now time.Time, e *quotaEntry, r int) int64 {
	c := e.count[r]
	if !b.heard[r].IsZero() && now.Sub(b.heard[r]) <= b.silentAfter {
		return c
	}
	if b.heard[r].IsZero() && now.Sub(b.start) <= b.silentAfter {
		return c
	}
	left := e.quota - c - e.told[r]
	if left <= 0 {
		return c
	}
	return c + int64(math.Ceil(b.fraction[r]*float64(left)))
}

// sweep forgets the quotas no report named for quotaForget. Called with b.mu held.
func (b *quotaBook) sweep(now time.Time) {
	b.swept = now
	for k, e := range b.entries {
		if now.Sub(e.touched) > quotaForget {
			delete(b.entries, k)
		}
	}
}

// isolatedFraction is region ri's weight in the default split.
func (b *quotaBook) isolatedFraction(ri int) float64 { return b.fraction[ri] }

// stats returns how many quotas the book holds and how many it could not take.
func (b *quotaBook) stats() (entries int, refused uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.entries), b.refused
}

// Quotas records a report's quota counts, after Ingest took the report, and fills resp's
// answer for them: the other regions' counts (see quotaBook.answer), whether the leader
// answers yet, the report's region's isolated fraction and SilentAfter. An unknown region
// answers nothing (Ingest refused its report).
func (c *Core) Quotas(now time.Time, r *allotv1.ReportRequest, resp *allotv1.ReportResponse) {
	ri, ok := c.regionIdx[r.GetRegion()]
	if !ok {
		return
	}
	resp.QuotaOthers, resp.QuotaAnswered = c.quotas.answer(now, membersHeard(now, r), ri, r.GetQuotas())
	resp.QuotaIsolatedFraction = c.quotas.isolatedFraction(ri)
	resp.QuotaHoldAfterMs = c.cfg.SilentAfter.Milliseconds()
}
