package quota

import (
	"cmp"
	"slices"
	"time"
)

// Count is one quota's count in this region, as this enforcer knows it: what the usage
// reports carry to the balancer, which answers with the other regions' counts (View).
type Count struct {
	Identity, Name string    // Name: "<rule id>/<limit name>"
	Start          time.Time // the period's start
	Quota          int64     // the quota in force at the entry's last check
	Count          int64     // the counter's last total + this enforcer's counts not yet in it
}

// Counts returns at most max of the table's quotas in their current period at now, those
// with the least left first when there are more (they matter most to the others), or nil
// when max ≤ 0. The counts are a snapshot: each entry read under its shard's lock.
func (t *Table) Counts(now time.Time, max int) []Count {
	if max <= 0 {
		return nil
	}
	var out []Count
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for k, e := range sh.entries {
			if !now.Before(e.end) || now.Before(e.start) {
				continue
			}
			out = append(out, Count{Identity: k.identity, Name: k.name, Start: e.start, Quota: e.quota,
				Count: e.known + e.pending + e.syncing})
		}
		sh.mu.Unlock()
	}
	if len(out) > max {
		slices.SortFunc(out, func(a, b Count) int { return cmp.Compare(a.Quota-a.Count, b.Quota-b.Count) })
		out = out[:max]
	}
	return out
}
