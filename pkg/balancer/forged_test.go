package balancer

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// Claims a valid-looking report makes are checked against what can be true (issue 27 §1).

// A forged acknowledgement of a version this leader never published is refused and
// acknowledges nothing (only acknowledgements let increases out: believing it could break
// Σ ≤ 1).
func TestForgedAcknowledgementRefused(t *testing.T) {
	c := newTestCore(t, nil)
	now := t0.Add(time.Second)
	c.Published(c.Tick(now), now)
	r := report("us-east", "e1", 1, now, use("key:a", 10, 0))
	r.ShareLeaderRev, r.ShareVersion = 7, 1_000_000
	if err := c.Ingest(now, r); !errors.Is(err, ErrInvalidReport) {
		t.Fatalf("a claim of version 1,000,000: %v, want ErrInvalidReport", err)
	}
	r.ShareLeaderRev, r.ShareVersion = 8, 1
	if err := c.Ingest(now, r); !errors.Is(err, ErrInvalidReport) {
		t.Fatalf("a claim of a newer leader's set: %v, want ErrInvalidReport", err)
	}
	if st := c.Stats(now); st.Regions[0].Acked != 0 || st.Regions[0].Reports != 0 {
		t.Fatalf("after forged acknowledgements: acked %d reports %d, want 0, 0", st.Regions[0].Acked, st.Regions[0].Reports)
	}
}

// An interval that ends in the future is refused.
func TestFutureIntervalRefused(t *testing.T) {
	c := newTestCore(t, nil)
	r := report("us-east", "e1", 1, t0.Add(time.Minute), use("key:a", 10, 0))
	if err := c.Ingest(t0, r); !errors.Is(err, ErrInvalidReport) {
		t.Fatalf("an interval ending a minute ahead: %v, want ErrInvalidReport", err)
	}
}

// A fake enforcer that floods reports claiming 100 s intervals and no usage does not
// shrink a region's measured demand for the keys its real enforcer reports: an enforcer's
// seconds are counted from the end of its last report (at most the wall time), and the
// region's rate is the mean per enforcer-second times its enforcers.
func TestLongClaimedIntervalsDoNotShrinkDemand(t *testing.T) {
	c := newTestCore(t, func(c *CoreConfig) { c.KeyTTL = time.Hour })
	now := t0
	seq := uint64(0)
	for i := 1; i <= 600; i++ { // 60 s in steps of 100 ms
		now = now.Add(100 * time.Millisecond)
		seq++
		fake := &allotv1.ReportRequest{Region: "us-east", EnforcerId: "fake", Seq: seq,
			IntervalStartMs: now.Add(-100 * time.Second).UnixMilli(), IntervalEndMs: now.UnixMilli()}
		if err := c.Ingest(now, fake); err != nil {
			t.Fatal(err)
		}
		if i%100 == 0 { // the real enforcer: 50/s of the victim every 10 s
			for r, name := range regions3 {
				var u []*allotv1.IdentityUsage
				if r == 0 {
					u = append(u, use("key:victim", 500, 0))
				}
				if err := c.Ingest(now, report(name, "real", uint64(i), now, u...)); err != nil {
					t.Fatal(err)
				}
			}
		}
		if p := c.Tick(now); p != nil {
			c.Published(p, now)
		}
	}
	s, ok := c.Identity("default", "key:victim")
	if !ok || s.Smoothed[0] < 40 {
		t.Fatalf("us-east's smoothed demand %v with a fake enforcer flooding long intervals, want ≥ 40/s of its 50/s", s.Smoothed)
	}
	t.Logf("smoothed demand %v", s.Smoothed)
}

// An enforcer that has fenced itself (silent for Stale + AckTimeout) leaves the table, its
// region keeping its default share reserved for another Stale: a table filled by ids that
// went silent (restarts, or ids a flood invented) takes new enforcers again once they have.
func TestFencedEnforcersLeaveTheTable(t *testing.T) {
	c := newTestCore(t, func(c *CoreConfig) { c.MaxEnforcers = 2 })
	for i, id := range []string{"e1", "e2"} {
		if err := c.Ingest(t0, report("us-east", id, uint64(i+1), t0)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Ingest(t0, report("us-east", "e3", 1, t0)); !errors.Is(err, ErrTooManyEnforcers) {
		t.Fatalf("a third enforcer: %v, want ErrTooManyEnforcers", err)
	}
	now := t0.Add(c.cfg.Stale + c.cfg.AckTimeout)
	if err := c.Ingest(now, report("us-east", "e3", 1, now)); err != nil {
		t.Fatalf("a new enforcer once the others fenced themselves: %v", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.acks(now)
	if n := len(c.regions[0].enforcers); n != 1 || !c.fenced[0] {
		t.Fatalf("%d enforcers tracked, fenced %v; want 1 and the region's default share reserved", n, c.fenced[0])
	}
}

// An admitted count above what the rule's limits allow over the interval is believed only
// up to Limits.MaxAdmitted: a region's enforcer (a certificate in an attacker's hands)
// claiming 1e6 admitted for a victim is read as at most 220/s of its 100/s limit, not
// 100,000/s. (Refusals are what clients sent and have no such bound: an insider can claim
// demand for its own region; max-min fairness still leaves the victim's region half.)
func TestImpossibleAdmittedCountIsBounded(t *testing.T) {
	lim := Limits{Rate: 100, Requests: 200, Global: []bucket.Limit{{Name: "second", Rate: 100, Burst: 200}}}
	if got, want := lim.MaxAdmitted(10), 100*(10+ClaimLead.Seconds())+200; got != want {
		t.Fatalf("MaxAdmitted(10) = %v, want %v", got, want)
	}
	c := newTestCore(t, func(c *CoreConfig) {
		c.Limits = func(string, string) (Limits, bool) { return lim, true }
	})
	now := t0
	for i := 1; i <= 6; i++ {
		now = now.Add(10 * time.Second)
		for r, name := range regions3 {
			var u []*allotv1.IdentityUsage
			switch r {
			case 0:
				u = append(u, use("key:victim", 600, 0)) // 60/s of a 100/s limit
			case 1:
				u = append(u, use("key:victim", 1e6, 0)) // forged
			}
			if err := c.Ingest(now, report(name, "e", uint64(i), now, u...)); err != nil {
				t.Fatal(err)
			}
		}
		if p := c.Tick(now); p != nil {
			c.Published(p, now)
		}
	}
	st := c.Stats(now)
	if st.Clamped != 6 {
		t.Fatalf("clamped %d entries, want the 6 forged ones", st.Clamped)
	}
	s, ok := c.Identity("default", "key:victim")
	if max := lim.MaxAdmitted(10) / 10; !ok || s.Smoothed[1] > max {
		t.Fatalf("eu-west's smoothed demand %v with 1e6 admitted claimed, want ≤ %v", s.Smoothed, max)
	}
	if s.Target[0] < 0.495 {
		t.Fatalf("us-east's target %v, want at least its max-min fair half", s.Target)
	}
	t.Logf("targets %v, smoothed demand %v", s.Target, s.Smoothed)
}

// A region that floods invented identities with large claimed refusals (which have no
// bound) displaces only its own: every region keeps its most demanded identities up to
// its part of MaxIdentities, and a region's new identities between recomputes are not
// shut out by another's flood. Before, the flood took every slot: the least demanded
// overall were evicted and new identities past the cap were dropped whatever their region.
func TestIdentityFloodDisplacesOnlyItsRegion(t *testing.T) {
	c := newTestCore(t, func(c *CoreConfig) { c.MaxIdentities, c.MaxPublished = 9, 9; c.Learning = time.Second })
	now := t0
	c.Published(c.Tick(now), now)
	var legit, flood []*allotv1.IdentityUsage
	for i := range 3 {
		legit = append(legit, use(fmt.Sprintf("key:us%d", i), 10, 0))
	}
	for i := range 30 {
		flood = append(flood, use(fmt.Sprintf("key:flood%d", i), 0, 1e9))
	}
	seq := uint64(0)
	ingest := func(region string, u []*allotv1.IdentityUsage) {
		t.Helper()
		seq++
		if err := c.Ingest(now, report(region, "e1", seq, now, u...)); err != nil {
			t.Fatal(err)
		}
	}
	tracked := func(id string) bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		x, ok := c.ids[key{"default", id}]
		return ok && !x.evict
	}
	ingest("us-east", legit)
	for range 3 {
		ingest("eu-west", flood)
		now = now.Add(10 * time.Second)
		c.Published(c.Tick(now), now)
	}
	for i := range 3 {
		if id := fmt.Sprintf("key:us%d", i); !tracked(id) {
			t.Errorf("%s (us-east's own, 10 tokens) is no longer tracked after eu-west's flood", id)
		}
	}
	ingest("eu-west", flood) // fills the room above the cap it may take
	ingest("ap-south", []*allotv1.IdentityUsage{use("key:ap", 10, 0)})
	if !tracked("key:ap") {
		t.Errorf("ap-south's new identity was dropped while eu-west floods: %+v", c.Stats(now))
	}
}
