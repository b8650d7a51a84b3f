package balancer_test

import (
	"fmt"
	"time"

	"github.com/allot-dev/allot/pkg/balancer"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// A simulation drives a Core on its own clock: reports in, Tick, write (here: nowhere),
// Published. Enforcers apply what is published and report the version they apply.
func ExampleCore() {
	cfg := balancer.DefaultCoreConfig()
	cfg.Regions = []string{"us-east", "eu-west", "ap-south"}
	cfg.Limits = func(rule, identity string) (balancer.Limits, bool) {
		return balancer.Limits{Rate: 100, Requests: 200}, rule == "default" // 100 tokens/s, burst 200, split by region weights
	}
	core, err := balancer.NewCore(cfg)
	if err != nil {
		panic(err)
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var applied uint64
	for s := 0; s < 60; s++ {
		now := start.Add(time.Duration(s) * time.Second)
		if s%10 == 9 { // every enforcer reports once an interval
			for i, region := range cfg.Regions {
				rate := 0.0
				if i == 0 {
					rate = 90 // tokens/s: all the traffic is in us-east
				}
				_ = core.Ingest(now, &allotv1.ReportRequest{
					Region: region, EnforcerId: region + "-1", Seq: uint64(s/10 + 1),
					IntervalStartMs: now.Add(-10 * time.Second).UnixMilli(), IntervalEndMs: now.UnixMilli(),
					ShareLeaderRev: cfg.LeaderRev, ShareVersion: applied,
					Usage: []*allotv1.IdentityUsage{{Rule: "default", Identity: "key:k1", Admitted: rate * 10}},
				})
			}
		}
		if p := core.Tick(now); p != nil {
			core.Published(p, now) // the write landed
			applied = p.Head.Version
		}
	}
	st, _ := core.Identity("default", "key:k1")
	fmt.Println(len(st.Published), "regions")
	// Output: 3 regions
}
