package balancer

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

func TestQuantise(t *testing.T) {
	nan := math.NaN()
	free := []float64{nan, nan, nan}
	for _, tc := range []struct {
		name                     string
		requests                 float64
		tgt, held, smoothed, pub []float64
		want                     []float64
	}{
		{"burst 1, one busy region", 1, []float64{0.98, 0.01, 0.01}, free, []float64{5, 0, 0}, []float64{1.0 / 3, 1.0 / 3, 1.0 / 3}, []float64{1, 0, 0}},
		{"burst 1, the busy one second", 1, []float64{0.01, 0.98, 0.01}, free, []float64{0, 5, 0}, nil, []float64{0, 1, 0}},
		{"whole already", 4, []float64{0.5, 0.25, 0.25}, free, nil, nil, []float64{0.5, 0.25, 0.25}},
		// 6 requests: 0.6 → 3.6, 0.3 → 1.8, 0.1 → 0.6: m = (3, 1, 0), 2 left by remainder
		// (0.8 first, then the tie of 0.6 and 0.6 to the first region): the first two
		// hold, the third none; the holders share the sum, one request each and the rest
		// (4/6) by how far each target is above one request (0.433 and 0.133).
		{"largest remainder", 6, []float64{0.6, 0.3, 0.1}, free, nil, nil, []float64{1.0/6 + 4.0/6*(0.6-1.0/6)/(0.6-1.0/6+0.3-1.0/6), 1.0/6 + 4.0/6*(0.3-1.0/6)/(0.6-1.0/6+0.3-1.0/6), 0}},
		// A tie between two busy regions goes to the larger demand ...
		{"tie by demand", 1, []float64{0.49, 0.49, 0.02}, free, []float64{1, 2, 0}, nil, []float64{0, 1, 0}},
		// ... unless the other holds the token now: noise does not move it back and forth.
		{"sticky", 1, []float64{0.45, 0.53, 0.02}, free, []float64{1, 2, 0}, []float64{1, 0, 0}, []float64{1, 0, 0}},
		// ... but not when its holder has no demand and a region with demand would hold
		// no request at all: burst 2 at the default split, us-east and eu-west holding
		// the requests, eu-west idle, ap-south refused everything (a 2/s key at 0.27).
		{"not sticky to an idle holder", 2, []float64{1.0 / 3, 1.0 / 3, 1.0 / 3}, free, []float64{0.37, 0, 0.7}, []float64{0.5, 0.5, 0}, []float64{0.5, 0, 0.5}},
		// ... nor when the region with demand holds a request already: burst 6, targets
		// (0.267, 0.063, 0.671) → (1.6, 0.38, 4.03), eu-west idle and holding the sixth
		// request; us-east, offered 1.2/s, gets it (it stayed with eu-west: 0.85 steady).
		{"not sticky to an idle holder beside a holder", 6, []float64{0.267, 0.063, 0.67}, free, []float64{1.18, 0, 2.32}, []float64{1.0 / 6, 1.0 / 6, 4.0 / 6}, []float64{1.0/6 + 4.0/6*(0.267-1.0/6)/(0.267+0.67-2.0/6), 0, 1.0/6 + 4.0/6*(0.67-1.0/6)/(0.267+0.67-2.0/6)}},
		// A leftover request goes to a region with demand before an idle one, whatever
		// the remainders: burst 6, targets (0.423, 0.477, 0.1) → (2.54, 2.86, 0.6), two
		// left; ap-south (idle, 0.6) ranked over us-east (0.54) and a 6/s key offered
		// 3.6/s in two regions held 2 and 3 requests of burst (steady 0.88). The two
		// regions with demand hold, and share the 0.1 ap-south's target leaves.
		{"demand first", 6, []float64{0.423, 0.477, 0.1}, free, []float64{1.63, 1.93, 0}, nil, []float64{1.0/6 + 4.0/6*(0.423-1.0/6)/(0.9-2.0/6), 1.0/6 + 4.0/6*(0.477-1.0/6)/(0.9-2.0/6), 0}},
		// Holders keep the fractions of their parts: a 5/s key offered about 1.2/s in
		// each of two regions holds 2.5 requests of burst in each, where whole requests
		// gave 3 and 2 and the region with 2 refused its Poisson bursts (steady 0.93).
		{"fractional holders", 5, []float64{0.5, 0.5, 0}, free, []float64{1.2, 1.2, 0}, nil, []float64{0.5, 0.5, 0}},
		// A held (silent) region keeps its target; the rest is handed out in requests and
		// the fraction under one request goes to the region holding most.
		{"held region", 2, []float64{0.3, 0.6, 0.1}, []float64{0.3, nan, nan}, []float64{0, 3, 1}, nil, []float64{0.3, 0.7, 0}},
		// Under one request to hand out: nothing to quantise (every region holds none).
		{"not one request", 1, []float64{0.5, 0.3, 0}, []float64{0.5, nan, nan}, nil, nil, []float64{0.5, 0.3, 0}},
		// 3 requests, Σ 0.8: 2 to hand out, m = (1, 0, 0), one more by remainder (0.6)
		// to eu-west; the fraction 0.8 − 2/3 to the first of the regions holding most.
		{"sum under 1 kept under", 3, []float64{0.5, 0.2, 0.1}, free, nil, nil, []float64{0.8 - 1.0/3, 1.0 / 3, 0}},
	} {
		tgt := append([]float64(nil), tc.tgt...)
		before := 0.0
		for _, v := range tc.tgt {
			before += v
		}
		quantise(tgt, tc.held, tc.smoothed, tc.pub, tc.requests)
		sum := 0.0
		for r := range tgt {
			sum += tgt[r]
			if math.Abs(tgt[r]-tc.want[r]) > 1e-9 {
				t.Errorf("%s: %v, want %v", tc.name, tgt, tc.want)
				break
			}
		}
		if sum > before+1e-12 {
			t.Errorf("%s: sum %g grew from %g", tc.name, sum, before)
		}
	}
}

// A 1-a-minute, burst-1 key attacked from one region and then another (issue 21 §1c):
// the balancer hands the one token of the burst to the busy region, whole, and moves it
// whole; at no instant do the shares the enforcers may apply give more than one region a
// token (world.check holds Σ ≤ 1 at every second as well).
func TestCoreSmallBurstMovesWholeTokens(t *testing.T) {
	c := newTestCore(t, func(cfg *CoreConfig) {
		cfg.Limits = func(rule, id string) (Limits, bool) {
			if rule == "reset" {
				return Limits{Rate: 1.0 / 60, Requests: 1}, true
			}
			return equalSplit(rule, id)
		}
	})
	w := newWorld(t, c, 2)
	k := key{"reset", "key:victim"}
	shift := t0.Add(3 * time.Minute)
	w.demand = hotDemand(k, 0.5, func(now time.Time) int {
		if now.Before(shift) {
			return 1
		}
		return 0
	})
	holders := func() int {
		n := 0
		for r, name := range c.cfg.Regions {
			m := 0.0
			for _, e := range w.enfs {
				if e.region == name {
					m = max(m, w.shareOf(e.ver, e.rev, k, r))
				}
			}
			if math.Floor(m+1e-9) >= 1 { // the enforcer's floor(burst × share)
				n++
			}
		}
		return n
	}
	for s := 0; s < 360; s++ {
		w.step(time.Second)
		if h := holders(); h > 1 {
			t.Fatalf("%v: %d regions may hold the burst's one token", w.now, h)
		}
		if s == 170 {
			if p := w.published(k); p[1] != 1 || p[0] != 0 || p[2] != 0 {
				t.Fatalf("before the shift: shares %v, want the whole token in eu-west", p)
			}
		}
	}
	if p := w.published(k); p[0] != 1 || p[1] != 0 || p[2] != 0 {
		t.Fatalf("after the shift: shares %v, want the whole token in us-east", p)
	}
}

// floor × regions ≤ 1 is the balancer's configuration's to check, not only
// share.AllocateChecked's (issue 21 §4).
func TestCoreConfigFloorFitsRegions(t *testing.T) {
	cfg := testConfig()
	cfg.Share.Floor = 0.4
	err := cfg.Validate()
	if err == nil || !strings.Contains(err.Error(), "CoreConfig.Share.Floor 0.4 × 3 regions = 1.2") {
		t.Fatalf("floor 0.4 over 3 regions: %v", err)
	}
	cfg.Share.Floor = 1.0 / 3
	if err := cfg.Validate(); err != nil {
		t.Fatalf("floor 1/3 over 3 regions: %v", err)
	}
}

// Ten regions with a 1% floor each held a busy key to 91% of its limit; the idle regions'
// reserve is now ReserveTotal (2%) in all, so the busy region gets 98% (issue 21 §4).
func TestReserveScalesWithRegions(t *testing.T) {
	var ten []string
	for i := range 10 {
		ten = append(ten, fmt.Sprintf("r%d", i))
	}
	c := newTestCore(t, func(cfg *CoreConfig) { cfg.Regions = ten })
	w := newWorld(t, c, 1)
	k := key{"default", "key:busy"}
	w.demand = hotDemand(k, 150, func(time.Time) int { return 0 })
	w.step(2 * time.Minute)
	if s := w.published(k); s[0] < 0.98-1e-9 || s[1] < 0.02/9-1e-9 {
		t.Fatalf("ten regions, one busy: shares %v, want ≥ 0.98 busy and 0.02/9 each idle", s)
	}
}
