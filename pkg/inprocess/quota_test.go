package inprocess

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/rules"
)

const quotaRules = `
rules:
  - id: default
    limits:
      - {name: second, rate: 1000, per: 1s}
      - {name: daily, quota: 900, period: day}
`

// TestQuotaSharedAcrossRegions: one daily quota of 900 for a key used in three regions at
// 50 checks a second each, through the real balancer (reports and answers over mutual
// TLS). Each region counts its own use; the others' reach it in the answers to its
// reports. Without them every region would admit the whole quota (2,700 in all); with
// them the regions together stop at the quota plus what they admit while the counts are
// on their way (about the others' rates × (a report interval + a flush), here 100/s × 3 s,
// once) — and keep refusing after.
func TestQuotaSharedAcrossRegions(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd, a balancer and three enforcers")
	}
	quotaShared(t, startStack(t, quotaRules, 1), 300)
}

// TestQuotaSharedThroughAggregators: the same with a report aggregator per region
// (issue 26 §3): the region's count goes up in the aggregator's forward and the answer
// comes back from the aggregator's copy of the leader's last answer, so the counts are on
// their way up to one interval longer (here 100/s × 1 s more).
func TestQuotaSharedThroughAggregators(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd, a balancer, three aggregators and three enforcers")
	}
	quotaShared(t, startStack(t, quotaRules, 1, func(c *Config) { c.Aggregate = true }), 400)
}

// quotaShared offers 50 checks a second of the quota's key in each region for 30 s and
// wants the regions together to admit the quota of 900, and at most over more.
func quotaShared(t *testing.T, s *Stack, over int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const perRegion, seconds = 50, 30
	var mu sync.Mutex
	admitted := map[string]int{}
	var wg sync.WaitGroup
	for _, region := range []string{"us-east", "eu-west", "ap-south"} {
		e := s.Enforcers(region)[0].Enforcer()
		wg.Go(func() {
			tick := time.NewTicker(time.Second / perRegion)
			defer tick.Stop()
			for range perRegion * seconds {
				select {
				case <-tick.C:
				case <-ctx.Done():
					return
				}
				d, err := e.Check(ctx, &enforcer.Request{Attrs: rules.Attrs{APIKey: "k_quota"}})
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					mu.Lock()
					admitted[region]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	total := admitted["us-east"] + admitted["eu-west"] + admitted["ap-south"]
	t.Logf("admitted %v: %d in all of a quota of 900 (%d offered)", admitted, total, 3*perRegion*seconds)
	if total < 900 {
		t.Fatalf("%d admitted of a quota of 900 with %d offered: under", total, 3*perRegion*seconds)
	}
	if total > 900+over {
		t.Fatalf("%d admitted in all regions of a quota of 900: the regions did not learn each other's counts", total)
	}
}
