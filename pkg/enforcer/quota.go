package enforcer

import (
	"context"
	"errors"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/quota"
	"github.com/allot-dev/allot/pkg/rules"
)

// Calendar quotas (rules.CalendarQuota), counted by a quota.Table (Config.Quotas).
//
// A rule's quotas are decided before its buckets, from memory (no store call but a
// key's first check in a period): a quota that refuses decides the check and its buckets
// are not taken from. The counts a check reserved are given back when the check ends
// refused (by a bucket, an in-flight limit or a later rule): refusals never count.
//
// A quota that decides states itself in the answer's RateLimit fields: Quota is the
// quota this region holds (the rule's, less the other regions' counts), Window the
// period's nominal length (a day 86400 s, a week 7 days, a month 30: Envoy's DAY, WEEK
// and MONTH), Remaining what is left in the period, and Reset, Effective (and RetryAfter
// on a refusal) the time to the period's end, the calendar boundary, without jitter. It
// decides an allowed answer when it has fewer left than the rule's buckets. Its Source is
// SourceLease (a local count between batches: the batch is a quota's lease) or, while
// its key is not synced with the counter, SourceFallback.
//
// Shadow rules count their quotas too (what they would have used) and note a would-be
// refusal. Quotas are not reported as usage to the balancer: the regions do not split
// them by shares.

// reserved is one quota count a check holds, given back if the check ends refused.
type reserved struct {
	q          *rules.CalendarQuota
	identity   string
	cost       int64
	start, end time.Time
}

// reserveQuotas decides m's calendar quotas for want tokens, counting them (unless peek)
// in sc, and makes a refusal d's answer (and an allowed quota d's budget when it has the
// fewest left). It returns an error only when ctx ended.
func (e *Enforcer) reserveQuotas(ctx context.Context, sc *scratch, m *rules.Matched, want int64, peek bool, now time.Time, chosen *bool, d *Decision) error {
	failClosed := m.Rule.FailMode == rules.FailClosed
	for i := range m.Rule.Calendar {
		q := &m.Rule.Calendar[i]
		var res quota.Result
		var err error
		switch {
		case e.quotas == nil:
			err = errNoQuotaTable
		case peek:
			res, err = e.quotas.Peek(ctx, m.Identity, q, want, failClosed, now)
		default:
			res, err = e.quotas.Reserve(ctx, m.Identity, q, want, failClosed, now)
		}
		if err != nil && !errors.Is(err, bucket.ErrUnavailable) && !errors.Is(err, errNoQuotaTable) {
			return err // ctx ended
		}
		if err != nil {
			e.metrics.storeErrors[m.Rule.FailMode&1].Inc()
			if failClosed {
				retry := e.cfg.FailClosedRetryAfter
				if e.quotas != nil {
					retry = e.quotas.FlushInterval()
				}
				e.fillQuota(d, m, q, &res, now)
				d.Allowed, d.Source, d.RetryAfter, d.Reset = false, SourceFailClosed, retry, retry
				return nil
			}
			continue // fail open: admitted, counted nowhere
		}
		if !res.Allowed {
			e.fillQuota(d, m, q, &res, now)
			d.Allowed = false
			d.RetryAfter = d.Reset
			return nil
		}
		if !peek {
			sc.reserved = append(sc.reserved, reserved{q: q, identity: m.Identity, cost: want, start: res.Start, end: res.End})
		}
		if !*chosen || res.Remaining() < d.Remaining {
			e.fillQuota(d, m, q, &res, now)
			*chosen = true
		}
	}
	return nil
}

var errNoQuotaTable = errors.New("enforcer: no quota table configured")

// fillQuota makes quota q of m's rule, as res states it, d's budget.
func (e *Enforcer) fillQuota(d *Decision, m *rules.Matched, q *rules.CalendarQuota, res *quota.Result, now time.Time) {
	d.Rule, d.Limit, d.Share, d.CountedBy = m.Rule.ID, q.Name, 1, rules.CountedBy(m.Identity)
	d.quota = m.Rule.Quota
	d.identity = m.Identity
	d.Quota, d.Window = max(res.Quota, 0), int64(q.Period.Nominal()/time.Second)
	d.Remaining = res.Remaining()
	end := res.End
	if end.IsZero() {
		_, end = q.Bounds(now)
	}
	d.Reset = end.Sub(now)
	d.Effective = d.Reset
	d.RetryAfter = 0
	d.Source = SourceLease
	if !res.Synced {
		d.Source = SourceFallback
	}
}

// finishQuotas, at the end of a check, gives back the quota counts of a refused check.
func (e *Enforcer) finishQuotas(sc *scratch, d *Decision) {
	if len(sc.reserved) == 0 {
		return
	}
	if !d.Allowed {
		for _, r := range sc.reserved {
			e.quotas.Cancel(r.identity, r.q, r.cost, r.start, r.end)
		}
	}
	clear(sc.reserved)
	sc.reserved = sc.reserved[:0]
}

// QuotaUsage is one calendar quota's use by one identity in the current period, for the
// admin's explain.
type QuotaUsage struct {
	Name      string    `json:"name"`
	Quota     int64     `json:"quota"`
	Period    string    `json:"period"`
	TimeZone  string    `json:"time_zone"`
	Used      int64     `json:"used"`
	Remaining int64     `json:"remaining"`
	Start     time.Time `json:"period_start"`
	Reset     time.Time `json:"reset"`
	// Synced is false when the count is this enforcer's alone (the counter did not
	// answer its last batch).
	Synced bool   `json:"synced"`
	Error  string `json:"error,omitempty"`
}

// quotaUsage reads m's quotas for explain.
func (e *Enforcer) quotaUsage(ctx context.Context, m *rules.Matched, now time.Time) []QuotaUsage {
	var out []QuotaUsage
	for i := range m.Rule.Calendar {
		q := &m.Rule.Calendar[i]
		u := QuotaUsage{Name: q.Name, Quota: q.Quota, Period: q.Period.String(), TimeZone: q.Zone}
		if e.quotas == nil {
			u.Error = errNoQuotaTable.Error()
			out = append(out, u)
			continue
		}
		res, err := e.quotas.Usage(ctx, m.Identity, q, now)
		u.Quota, u.Used, u.Remaining, u.Synced = res.Quota, res.Used, res.Remaining(), res.Synced
		u.Start, u.Reset = res.Start.UTC(), res.End.UTC()
		if err != nil {
			u.Error = err.Error()
		}
		out = append(out, u)
	}
	return out
}

// checkQuotas decides m's quotas for hits × cost tokens (reserveQuotas); a cost that
// cannot be asked for is refused as too large when no bucket of the rule will say so.
func (e *Enforcer) checkQuotas(ctx context.Context, sc *scratch, m *rules.Matched, hits int64, peek bool, now time.Time, chosen *bool, d *Decision) error {
	want, ok := tokens(m.Cost, hits)
	if !ok {
		if len(m.Rule.Global) == 0 {
			var res quota.Result
			e.fillQuota(d, m, &m.Rule.Calendar[0], &res, now)
			d.Allowed, d.Source, d.RetryAfter = false, SourceTooLarge, 0
		}
		return nil
	}
	return e.reserveQuotas(ctx, sc, m, want, peek, now, chosen, d)
}
