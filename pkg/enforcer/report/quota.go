package report

import (
	"math"
	"sync"
	"time"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// Calendar quotas across regions: the enforcer's half (the balancer's is
// pkg/balancer/quota.go, whose comment says which way the whole errs).
//
// Every report carries this region's count of each quota the enforcer counts
// (QuotaCounter); the leader answers each with the other regions' counts summed, and the
// QuotaView keeps those answers. The enforcer admits a quota's request while its
// region's count plus QuotaView.Others stays within the quota.
//
// While the enforcer hears no answer (its reports fail, or the leader is new and warming
// up) for Stale, it holds its region to what the balancer counts a silent region at: its
// count at the last answer plus its isolated fraction of what was left then. Others
// returns the others' count that makes that so.

// QuotaCounter gives the region's quota counts a report carries: at most max, those
// nearest their quota first when there are more.
type QuotaCounter interface {
	QuotaCounts(now time.Time, max int) []*allotv1.QuotaCount
}

// QuotaKey names one quota in one period.
type QuotaKey struct {
	Rule, Limit, Identity string
	PeriodStartMs         int64
}

type quotaSeen struct {
	others int64 // the others' count last answered
	floor  int64 // the largest answered by an earlier leader (a new term never lowers it)
	rev    int64 // the leader term of others
	own    int64 // this region's count in the report others answered
	quota  int64 // the quota then
}

// QuotaView holds the balancer's answers about the other regions' quota counts. Safe for
// concurrent use; the zero value is not usable (NewQuotaView).
type QuotaView struct {
	mu sync.RWMutex // mu guards every field below; Others (every quota check) reads

	stale    time.Duration
	max      int
	answered time.Time // the last answer (zero: none yet)
	fraction float64   // this region's isolated fraction, as the leader last said
	seen     map[QuotaKey]*quotaSeen
}

// NewQuotaView returns a view that holds its region on its own after stale without an
// answer (the leader's SilentAfter once an answer has said it), keeping at most max quotas (past it, answers for new quotas are dropped: those
// quotas count this region only, over by the others' counts).
func NewQuotaView(stale time.Duration, max int) *QuotaView {
	return &QuotaView{stale: stale, max: max, fraction: 1, seen: map[QuotaKey]*quotaSeen{}}
}

// Answered takes the leader's answer to a report that carried sent.
func (v *QuotaView) Answered(at time.Time, sent []*allotv1.QuotaCount, resp *allotv1.ReportResponse) {
	if !resp.GetQuotaAnswered() {
		return
	}
	own := make(map[QuotaKey]*allotv1.QuotaCount, len(sent))
	for _, q := range sent {
		own[QuotaKey{q.Rule, q.Limit, q.Identity, q.PeriodStartMs}] = q
	}
	rev := resp.GetLeaderRev()
	v.mu.Lock()
	defer v.mu.Unlock()
	v.answered = at
	if f := resp.GetQuotaIsolatedFraction(); f > 0 && f <= 1 {
		v.fraction = f
	}
	if h := time.Duration(resp.GetQuotaHoldAfterMs()) * time.Millisecond; h > 0 && h <= time.Hour {
		v.stale = h // the leader's SilentAfter: hold when it starts counting the region so
	}
	for _, o := range resp.GetQuotaOthers() {
		k := QuotaKey{o.Rule, o.Limit, o.Identity, o.PeriodStartMs}
		mine := own[k]
		if mine == nil || o.Count < 0 {
			continue // not asked: not believed
		}
		s := v.seen[k]
		if s == nil {
			if len(v.seen) >= v.max {
				v.forgetOld(o.PeriodStartMs)
			}
			if len(v.seen) >= v.max {
				continue
			}
			s = &quotaSeen{rev: rev}
			v.seen[k] = s
		}
		if s.rev != rev {
			s.floor, s.rev = max(s.floor, s.others), rev
		}
		s.others, s.own, s.quota = o.Count, mine.Count, mine.Quota
	}
}

// forgetOld drops the quotas of periods that started before period. Called with mu held.
func (v *QuotaView) forgetOld(period int64) {
	for k := range v.seen {
		if k.PeriodStartMs < period {
			delete(v.seen, k)
		}
	}
}

// Others returns the count of k's quota this region must add to its own: the others'
// count last answered (never below an earlier leader's), or, after Stale without an
// answer, the count that holds the region to its count at the last answer plus its
// isolated fraction of what was left then. 0 for a quota never answered.
func (v *QuotaView) Others(now time.Time, k QuotaKey) int64 {
	v.mu.RLock()
	defer v.mu.RUnlock()
	s := v.seen[k]
	if s == nil {
		return 0
	}
	o := max(s.others, s.floor)
	if now.Sub(v.answered) <= v.stale {
		return o
	}
	// own + Others ≤ quota ⇔ own ≤ own₀ + f × left, left = quota − own₀ − o.
	left := s.quota - s.own - o
	if left <= 0 {
		return o
	}
	return o + left - int64(math.Floor(v.fraction*float64(left)))
}

// Held reports whether the view holds its region on its own (no answer for Stale).
func (v *QuotaView) Held(now time.Time) bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return !v.answered.IsZero() && now.Sub(v.answered) > v.stale
}
