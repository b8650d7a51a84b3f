package balancer

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// A region whose gateways send all of a key's traffic to one of its enforcers (a
// gateway pinned to one enforcer, or one that hashes by key) is not a move each time that
// enforcer reports. The arrival test read the region's rate as that enforcer's rate
// times the region's enforcers, twice the truth with two: a key over its limit at 80/s
// in each of two regions, each region's traffic on its first enforcer, was read at 160/s
// in whichever region reported last, and its shares swung between the regions every
// round of acknowledgements (the region-down drill: a version every 0.7 s for a minute,
// and a region given 0.01 as it died). The region's rate is that enforcer's rate times
// the enforcers that carry the key.
func TestTrafficOnOneEnforcerIsNotAMove(t *testing.T) {
	for _, tc := range []struct {
		name     string
		pinned   bool
		versions int // at most, in the two steady minutes
	}{{"pinned", true, 2}, {"spread", false, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newTestCore(t, func(c *CoreConfig) { c.Regions = regions3[:2]; c.KeyTTL = time.Hour })
			now := t0
			type enf struct {
				region, id string
				seq        uint64
				last, next time.Time
				answerAt   time.Time
			}
			var enfs []*enf
			for r, region := range c.cfg.Regions {
				for i := range 2 {
					enfs = append(enfs, &enf{region: region, id: fmt.Sprintf("%s-%d", region, i+1), last: now,
						next: now.Add(time.Duration(r*2500+i*5000)*time.Millisecond + 10*time.Second)})
				}
			}
			const offered = 80.0 // a region, of a 100/s key
			send := func(e *enf, ack bool) {
				secs := now.Sub(e.last).Seconds()
				e.last = now
				share := c.cfg.weightSplit()[c.regionIdx[e.region]]
				if s, ok := c.Identity("default", "key:a"); ok {
					share = s.Published[c.regionIdx[e.region]]
				}
				rate := offered / 2 // this enforcer's part
				if tc.pinned {
					rate = 0
					if strings.HasSuffix(e.id, "-1") {
						rate = offered
					}
				}
				r := recentReport(e.region, e.id, e.seq+1, now, c.Stats(now).Version)
				e.seq++
				r.IntervalStartMs = now.Add(-time.Duration(secs * float64(time.Second))).UnixMilli()
				r.Ack = ack
				if rate > 0 {
					adm := min(rate, 100*share*rate/offered) // the region's bucket, pro rata
					u := useRecent("key:a", adm*secs, (rate-adm)*secs, rate)
					u.RecentTokens = rate
					r.Usage = append(r.Usage, u)
				}
				if err := c.Ingest(now, r); err != nil {
					t.Fatal(err)
				}
			}
			var steadyFrom uint64
			lastVer := c.Stats(now).Version
			for step := 0; step < 4*180; step++ { // three minutes, 250 ms a step
				now = now.Add(250 * time.Millisecond)
				if step == 4*60 {
					steadyFrom = c.Stats(now).Version
				}
				for _, e := range enfs {
					if !now.Before(e.next) {
						send(e, false)
						e.next = e.next.Add(10 * time.Second)
					}
					if !e.answerAt.IsZero() && !now.Before(e.answerAt) {
						send(e, true)
						e.answerAt = time.Time{}
					}
				}
				if p := c.Tick(now); p != nil {
					c.Published(p, now)
				}
				if v := c.Stats(now).Version; v != lastVer {
					lastVer = v
					for _, e := range enfs {
						e.answerAt = now.Add(300 * time.Millisecond)
					}
				}
			}
			s, _ := c.Identity("default", "key:a")
			got := c.Stats(now).Version - steadyFrom
			t.Logf("%s: %d versions in the two steady minutes (%d in all), shares %.3f", tc.name, got, lastVer, s.Published)
			if got > uint64(tc.versions) {
				t.Errorf("%s: %d versions in two steady minutes of an unmoving key, want ≤ %d", tc.name, got, tc.versions)
			}
			if math.Abs(s.Published[0]-s.Published[1]) > 0.1 {
				t.Errorf("%s: shares %.3f for equal traffic, want about equal", tc.name, s.Published)
			}
		})
	}
}

// spread counts the enforcers that carried a key in this window or the last: all the
// region's live ones before any did, then those seen, and all again once two windows
// pass without one.
func TestSpreadCountsTheEnforcersThatCarryAKey(t *testing.T) {
	c := newTestCore(t, nil)
	id := &ident{}
	a, b := enforcerBit("eu-west-1"), enforcerBit("eu-west-2")
	if a == b {
		t.Fatal("the test's enforcer names collide")
	}
	now := t0
	for _, st := range []struct {
		after time.Duration
		bit   uint64
		want  int
	}{
		{0, a, 3},                  // traffic new to the region: spread over all
		{time.Second, a, 1},        // one enforcer carries it
		{time.Second, b, 2},        // a second one
		{c.cfg.Interval, a, 2},     // b is still in the last window
		{c.cfg.Interval, a, 1},     // b has left both
		{3 * c.cfg.Interval, b, 3}, // none for two windows: new again
	} {
		now = now.Add(st.after)
		if got := c.spread(now, id, 1, st.bit, 3); got != st.want {
			t.Fatalf("at %v: spread %d, want %d", now.Sub(t0), got, st.want)
		}
	}
	if got := c.spread(now, id, 0, a, 3); got != 3 {
		t.Fatalf("another region: spread %d, want 3", got)
	}
	for _, tc := range []struct {
		mask uint64
		want int
	}{{0, 0}, {1, 1}, {0xff, 9}, {0xffffffff, 44}, {^uint64(0), math.MaxInt}} {
		if got := bitsCounted(tc.mask); got != tc.want {
			t.Errorf("bitsCounted(%#x) = %d, want %d", tc.mask, got, tc.want)
		}
	}
}
