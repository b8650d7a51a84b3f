package balancer

import (
	"math"
	"testing"
	"time"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// A key new to the balancer, named so far only by us-east's reports, is not read as
// absent from a region until that region's reports since it appeared would have shown
// UnseenRequests at us-east's rate (holdUnseen): until then the region keeps its
// published share. A region that named it once, or that reads it now, is never held; the
// part of a window before it appeared counts for nothing.
func TestHoldUnseen(t *testing.T) {
	c := newTestCore(t, nil)
	c.begin(t0)
	born := t0.Add(time.Minute)
	heard := func(r int, after ...time.Duration) {
		rs := &c.regions[r]
		rs.enforcers = map[string]*enforcerState{}
		for i, d := range after {
			rs.enforcers[string(rune('a'+i))] = &enforcerState{lastHeard: born.Add(d)}
		}
	}
	nan := math.NaN()
	for _, tc := range []struct {
		name  string
		after []time.Duration // eu-west's enforcers heard this long after the key appeared
		sm    float64         // eu-west's smoothed demand
		held  bool            // eu-west held; ap-south (not heard this window, never read) too, but for the last case
	}{
		{"eu-west heard 0.5, 1 and 2 s after: 1.2 region-seconds, 1.75 requests at 1.5/s", []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second}, nan, true},
		{"heard 3, 5 and 7 s after: 5 region-seconds, 7.5 requests", []time.Duration{3 * time.Second, 5 * time.Second, 7 * time.Second}, nan, false},
		{"heard before it appeared only", []time.Duration{-time.Second, -2 * time.Second, -3 * time.Second}, nan, true},
		{"heard 1 s after, windows of 10 s: 1.5 requests (the 9 s before it appeared count nothing)", []time.Duration{time.Second, time.Second, time.Second}, nan, true},
		{"eu-west read it before", []time.Duration{time.Second, time.Second, time.Second}, 0.4, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			heard(0, 0)
			heard(1, tc.after...)
			heard(2, tc.after...)
			now := born.Add(8 * time.Second)
			id := &ident{born: born}
			id.st.Smoothed = []float64{1.5, tc.sm, nan}
			demand := []float64{1.5, 0, nan} // ap-south not heard this window
			held := []float64{nan, nan, nan}
			pub := []float64{1.0 / 3, 1.0 / 3, 1.0 / 3}
			c.coverSince(now).hold(id, 1.5, demand, held, pub)
			if got := !math.IsNaN(held[1]); got != tc.held {
				t.Fatalf("eu-west held %v (%v), want %v", got, held[1], tc.held)
			}
			if !math.IsNaN(held[0]) {
				t.Fatalf("us-east, which reads it, held at %v", held[0])
			}
			if want := tc.held || tc.sm > 0; math.IsNaN(held[2]) == want {
				t.Fatalf("ap-south (not heard this window, never read) held %v, want %v", held[2], want)
			}
		})
	}
}

// On a core: a key new to the balancer (4/s, a burst of 12) first named by us-east's
// early report, which a move of a busy key brought, half a second after a round of
// reports that did not name it. The recompute the move asks for must not hand eu-west's
// and ap-south's thirds to us-east — their reports have not said a word since the key
// appeared (it was 0.00 in both before holdUnseen, and every request there refused until
// their reports and the recomputes after gave some back). Once their next reports come
// without it, us-east, where it is offered 6/s, gets more.
func TestNewKeyNotTakenFromRegionsNotHeardSince(t *testing.T) {
	c := newKeyCore(t, Limits{Rate: 4, Requests: 12}, nil)
	now := t0
	send := reportsTo(t, c, &now)
	tick := func() { tickPublished(c, now) }
	round := func(busyIn string, u ...*allotv1.IdentityUsage) {
		for _, r := range regions3 {
			if r == busyIn {
				send(r, false, append([]*allotv1.IdentityUsage{useRecent("key:busy", 500, 250, 150)}, u...)...)
			} else {
				send(r, false)
			}
		}
	}
	for i := range 60 {
		now = now.Add(time.Second)
		if i%5 == 0 {
			round("eu-west")
		}
		tick()
	}
	// A round, then the busy key moves to us-east and the new key appears there: us-east
	// reports early 0.5 s later.
	round("eu-west")
	tick()
	now = now.Add(500 * time.Millisecond)
	send("us-east", true, useRecent("key:busy", 1, 74, 150), useRecent("key:new", 3, 0, 6))
	for range 8 { // 2 s of ticks, every version acknowledged at once by every region
		now = now.Add(250 * time.Millisecond)
		tick()
	}
	s, ok := c.Identity("default", "key:new")
	if !ok {
		t.Fatal("key:new not tracked")
	}
	t.Logf("2 s after key:new appeared: target %v, published %v", s.Target, s.Published)
	for r := 1; r <= 2; r++ {
		if s.Target[r] < 1.0/3-1e-9 {
			t.Fatalf("%s's target %v for a key its reports have not had a chance to name, want its third kept", regions3[r], s.Target)
		}
	}
	// eu-west's and ap-south's next reports (5 s later) do not name it either; us-east's
	// reads it at 6/s, over its third of 4/s.
	now = now.Add(3 * time.Second)
	round("us-east", useRecent("key:new", 20, 10, 6))
	for range 40 { // to the interval's recompute, and its plan
		now = now.Add(250 * time.Millisecond)
		tick()
	}
	if s, _ := c.Identity("default", "key:new"); s.Target[0] <= 1.0/3+1e-9 {
		t.Fatalf("after eu-west and ap-south reported 5 s without it: target %v, want us-east above its third", s.Target)
	} else {
		t.Logf("after their reports: target %v", s.Target)
	}
}

// A new deployment: every key starts at once, and the enforcers' first windows are mostly
// the time before (regionsim's cold start, and a region's first reports of any key that
// appears late in an interval). ap-south's early report, 0.6 s in, names a 3/s key it was
// offered 4 times in those 0.6 s (recent rate 6.7/s); eu-west's report a moment later
// covers ten seconds of which the key was there for 0.6. The key was read as absent there
// and eu-west, offered 0.56/s, was refused everything for 16 s (k01056 of the population
// with advised bursts). Its age is read from its first report (firstAge): the 9.4 s
// before it count nothing, and eu-west keeps its third until its reports since say more.
func TestNewKeysFirstWindowsCountFromItsStart(t *testing.T) {
	c := newKeyCore(t, Limits{Rate: 3, Requests: 10}, nil)
	start := t0
	now := start
	tickPublished(c, now)
	send := reportsTo(t, c, &now)
	now = start.Add(600 * time.Millisecond)
	send("ap-south", true, useRecent("key:new", 3, 1, 4/0.6))
	now = now.Add(100 * time.Millisecond)
	send("eu-west", false)
	send("us-east", false)
	for range 8 {
		now = now.Add(250 * time.Millisecond)
		tickPublished(c, now)
	}
	s, ok := c.Identity("default", "key:new")
	if !ok {
		t.Fatal("key:new not tracked")
	}
	t.Logf("2 s in: target %v, published %v", s.Target, s.Published)
	for r := range 2 {
		if s.Target[r] < 1.0/3-1e-9 {
			t.Fatalf("%s's target %v: a window of which the key was there for 0.6 s read as without it", regions3[r], s.Target)
		}
	}
}

func TestFirstAge(t *testing.T) {
	for _, tc := range []struct {
		name            string
		u               *allotv1.IdentityUsage
		secs            float64
		reports, recent int
		want            time.Duration
	}{
		{"15 tokens at 10/s: there for the last 1.5 s of 10", useRecent("k", 12, 3, 10), 10, 1, 1, 1500 * time.Millisecond},
		{"at its window's rate: the whole window", useRecent("k", 100, 0, 10), 10, 1, 1, 10 * time.Second},
		{"no recent rate: the whole window", use("k", 15, 0), 10, 1, 0, 10 * time.Second},
		{"a recent rate under the window's: at most the window", useRecent("k", 100, 0, 5), 10, 1, 1, 10 * time.Second},
		{"an aggregator's 3 reports of 10 s, 10 tokens each at 10/s: 1 s", useRecent("k", 30, 0, 30), 30, 3, 3, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := firstAge(tc.u, tc.secs, tc.reports, tc.recent); (got - tc.want).Abs() > time.Millisecond {
				t.Fatalf("firstAge = %v, want %v", got, tc.want)
			}
		})
	}
}

// A new key of 2/s (a burst of 7) offered 0.58/s in eu-west and 0.51/s in ap-south,
// recomputed every half second (a busy population recomputes every second or less while
// its keys move). Read from each half second's reports, eu-west's two requests in one
// of them were 4/s, over the limit: it was given 0.98 and ap-south 0.01 (k01262 of the
// population's seed 28). A young key is read from every report since it appeared.
func TestYoungKeyReadOverItsLife(t *testing.T) {
	c := newKeyCore(t, Limits{Rate: 2, Requests: 7}, func(c *CoreConfig) {
		c.Interval = 500 * time.Millisecond
		c.Learning = 500 * time.Millisecond
	})
	start := t0
	now := start
	tickPublished(c, now)
	arrivals := map[string][]float64{ // seconds after the start
		"eu-west":  {0.3, 1.4, 2.1, 2.3, 3.2, 4.6, 6.1, 7.0},
		"ap-south": {0.8, 1.9, 2.4, 3.9, 4.4, 5.5, 6.8, 7.9},
	}
	count := func(region string, from, to float64) (n float64) {
		for _, a := range arrivals[region] {
			if a >= from && a < to {
				n++
			}
		}
		return n
	}
	seq := uint64(0)
	for step := 1; step <= 16; step++ {
		now = start.Add(time.Duration(step) * 500 * time.Millisecond)
		at := float64(step) / 2
		for _, r := range regions3 {
			seq++
			var u []*allotv1.IdentityUsage
			if n := count(r, at-0.5, at); n > 0 {
				u = append(u, useRecent("key:new", n, 0, count(r, at-1, at)))
			}
			rq := recentReport(r, r+"-1", seq, now, c.Stats(now).Version, u...)
			if step > 1 {
				rq.IntervalStartMs = now.Add(-500 * time.Millisecond).UnixMilli()
			}
			if err := c.Ingest(now, rq); err != nil {
				t.Fatal(err)
			}
		}
		tickPublished(c, now)
		s, ok := c.Identity("default", "key:new")
		if !ok {
			continue
		}
		if s.Target[1] > 0.8 || s.Target[2] > 0.8 || s.Target[1] < 0.2 || s.Target[2] < 0.2 {
			t.Fatalf("%.1f s in: target %v, want eu-west and ap-south, at 0.58/s and 0.51/s of 2/s, both between 0.2 and 0.8", at, s.Target)
		}
	}
	s, _ := c.Identity("default", "key:new")
	t.Logf("8 s in: target %v, published %v", s.Target, s.Published)
}

// A young key whose traffic moves, reported by enforcers that send no recent rates (so no
// shift is read from them): its life so far still holds the region it left, and read
// over its life it would follow the move only as the old traffic's weight in that life
// fell. Its window reading three deviations away from its life says it moved
// (lifeMoved); from then on its windows are read.
func TestYoungKeyThatMovesIsReadFromItsWindows(t *testing.T) {
	c := newTestCore(t, func(c *CoreConfig) {
		c.KeyTTL = time.Hour
		c.Interval = time.Second
		c.Learning = time.Second
	})
	start := t0
	now := start
	tickPublished(c, now)
	seq := uint64(0)
	hot := 0
	moved := time.Duration(0)
	for step := 1; step <= 15; step++ {
		now = start.Add(time.Duration(step) * time.Second)
		if step == 5 {
			hot = 2
		}
		for r, name := range regions3 {
			seq++
			ver := c.Stats(now).Version
			var u []*allotv1.IdentityUsage
			if r == hot {
				u = append(u, use("key:a", 95, 0)) // of a limit of 100, over the last second
			}
			rq := report(name, "e-"+name, seq, now, u...)
			rq.IntervalStartMs = now.Add(-time.Second).UnixMilli()
			rq.ShareLeaderRev, rq.ShareVersion = 7, ver
			if err := c.Ingest(now, rq); err != nil {
				t.Fatal(err)
			}
		}
		tickPublished(c, now)
		s, _ := c.Identity("default", "key:a")
		if step >= 5 && moved == 0 && s.Published[2] >= 0.9 {
			moved = time.Duration(step-4) * time.Second
		}
	}
	if moved == 0 || moved > 4*time.Second {
		s, _ := c.Identity("default", "key:a")
		t.Fatalf("ap-south at ≥ 0.9 %v after the move (0: not in 10 s; published %v), want within 4 s", moved, s.Published)
	}
	t.Logf("ap-south at ≥ 0.9 %v after the move", moved)
}

// newKeyCore is a test core on which "key:new" has the limits lim and every other
// identity equalSplit's, its identities kept for an hour, and mod applied.
func newKeyCore(t *testing.T, lim Limits, mod func(*CoreConfig)) *Core {
	return newTestCore(t, func(c *CoreConfig) {
		c.KeyTTL = time.Hour
		c.Limits = func(rule, identity string) (Limits, bool) {
			if identity == "key:new" {
				return lim, true
			}
			return equalSplit(rule, identity)
		}
		if mod != nil {
			mod(c)
		}
	})
}

// reportsTo sends c a report of region's one enforcer at *now, with recent rates, flagged
// early when asked, its seqs counting up.
func reportsTo(t *testing.T, c *Core, now *time.Time) func(region string, early bool, u ...*allotv1.IdentityUsage) {
	seq := uint64(0)
	return func(region string, early bool, u ...*allotv1.IdentityUsage) {
		seq++
		r := recentReport(region, region+"-1", seq, *now, c.Stats(*now).Version, u...)
		r.Early = early
		if err := c.Ingest(*now, r); err != nil {
			t.Fatal(err)
		}
	}
}
