package node

import (
	"strings"
	"time"

	"github.com/allot-dev/allot/pkg/enforcer/report"
	"github.com/allot-dev/allot/pkg/quota"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// quotaRegions joins the calendar quota table to the usage reports: the region's counts
// go out with every report (report.QuotaCounter), and the other regions' counts the
// leader answers come back into every quota check (quota.View, through
// report.QuotaView). pkg/balancer/quota.go says which way the whole errs.
type quotaRegions struct {
	table *quota.Table // set once the table is built, before the Reporter starts
	view  *report.QuotaView
}

// QuotaCounts implements report.QuotaCounter.
func (q *quotaRegions) QuotaCounts(now time.Time, max int) []*allotv1.QuotaCount {
	cs := q.table.Counts(now, max)
	out := make([]*allotv1.QuotaCount, 0, len(cs))
	for _, c := range cs {
		rule, limit := splitQuotaName(c.Name)
		out = append(out, &allotv1.QuotaCount{Rule: rule, Limit: limit, Identity: c.Identity,
			PeriodStartMs: c.Start.UnixMilli(), Quota: c.Quota, Count: c.Count})
	}
	return out
}

// Others implements quota.View.
func (q *quotaRegions) Others(now time.Time, identity, name string, start time.Time) int64 {
	rule, limit := splitQuotaName(name)
	return q.view.Others(now, report.QuotaKey{Rule: rule, Limit: limit, Identity: identity, PeriodStartMs: start.UnixMilli()})
}

// splitQuotaName cuts "<rule id>/<limit name>" at its last slash (a limit name has none).
func splitQuotaName(name string) (rule, limit string) {
	i := strings.LastIndexByte(name, '/')
	if i < 0 {
		return name, ""
	}
	return name[:i], name[i+1:]
}
