package balancer

import (
	"fmt"
	"testing"
	"time"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// Top ranks by total smoothed demand, skips identities with none, and copies.
func TestTopRanksByDemand(t *testing.T) {
	c := newTestCore(t, func(c *CoreConfig) { c.Learning = time.Second })
	if got := c.Top(3); len(got) != 0 {
		t.Fatalf("Top before any report = %v, want none", got)
	}
	now := t0
	for i := range 3 {
		now = now.Add(10 * time.Second)
		var us []*allotv1.IdentityUsage
		for k := range 50 {
			us = append(us, use(fmt.Sprintf("key:%02d", k), float64(10*k), float64(k%2)))
		}
		us = append(us, use("key:idle", 0, 0))
		for _, r := range regions3 {
			if err := c.Ingest(now, report(r, r+"-1", uint64(i+1), now, us...)); err != nil {
				t.Fatal(err)
			}
		}
		if p := c.Tick(now); p != nil {
			c.Published(p, now)
		}
	}
	top := c.Top(5)
	if len(top) != 5 {
		t.Fatalf("Top(5) returned %d", len(top))
	}
	for i, x := range top {
		if want := fmt.Sprintf("key:%02d", 49-i); x.Identity != want || x.Rule != "default" {
			t.Errorf("Top(5)[%d] = %s %s, want default %s", i, x.Rule, x.Identity, want)
		}
		if !(x.Demand > 0) || len(x.Smoothed) != 3 || len(x.Published) != 3 || x.Rate != 100 {
			t.Errorf("Top(5)[%d] = %+v: want demand > 0, 3 regions, rate 100", i, x)
		}
		st, ok := c.Identity(x.Rule, x.Identity)
		if !ok || st.Version != x.Version || st.Rate != x.Rate {
			t.Errorf("Identity(%s) = %+v, want the same state as Top's %+v", x.Identity, st, x.IdentityState)
		}
	}
	for i := 1; i < len(top); i++ {
		if top[i].Demand > top[i-1].Demand {
			t.Fatalf("Top not sorted: %g after %g", top[i].Demand, top[i-1].Demand)
		}
	}
	if all := c.Top(1000); len(all) != 49 { // key:00 and key:idle have no demand
		t.Fatalf("Top(1000) returned %d, want the 49 with demand", len(all))
	}
	top[0].Published[0] = -1
	if st, _ := c.Identity(top[0].Rule, top[0].Identity); st.Published[0] == -1 {
		t.Fatal("Top returned the core's own slice")
	}
	if c.Top(0) != nil {
		t.Fatal("Top(0) != nil")
	}
}
