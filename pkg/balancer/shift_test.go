package balancer

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// recentReport is a report whose entries carry recent rates (report.Table measures them).
func recentReport(region, enf string, seq uint64, end time.Time, ver uint64, u ...*allotv1.IdentityUsage) *allotv1.ReportRequest {
	r := report(region, enf, seq, end, u...)
	r.RecentWindowMs, r.ShareLeaderRev, r.ShareVersion = 1000, 7, ver
	return r
}

// tickPublished ticks c at now and confirms the write of what it publishes, as the
// service does once etcd took it.
func tickPublished(c *Core, now time.Time) {
	if p := c.Tick(now); p != nil {
		c.Published(p, now)
	}
}

func useRecent(identity string, admitted, refused, recent float64) *allotv1.IdentityUsage {
	u := use(identity, admitted, refused)
	u.RecentRate = recent
	return u
}

// A move costs one acknowledged round trip (issue 21 §2): the region the traffic reached
// reports its recent rate (not its interval's average, which still holds the quiet
// seconds), the region it left acknowledges the decrease with its own recent rate (0),
// and each step is published as soon as it is due, not at the next MinVersionGap slot.
func TestMoveInOneAcknowledgedRoundTrip(t *testing.T) {
	reached, _ := moveOnce(t, 250*time.Millisecond)
	if reached > 3*time.Second {
		t.Fatalf("us-east reached 0.95 %v after the move, want ≤ 3 s", reached)
	}
}

// Ticked at every acknowledgement (balancer.Service's kick), the steps of a move are
// still at least StepGap apart, and the move no slower: the acknowledgements of a version
// arrive one by one, and each that completed a plan would otherwise write a version of
// its own for every enforcer to acknowledge again.
func TestStepsAtMostEveryStepGap(t *testing.T) {
	reached, versions := moveOnce(t, 50*time.Millisecond)
	for i := 1; i < len(versions); i++ {
		if d := versions[i].Sub(versions[i-1]); d < DefaultCoreConfig().StepGap {
			t.Errorf("versions %v apart, want ≥ StepGap %v (all at %v)", d, DefaultCoreConfig().StepGap, versions)
		}
	}
	if reached > 3*time.Second {
		t.Fatalf("us-east reached 0.95 %v after the move, want ≤ 3 s", reached)
	}
}

// moveOnce moves a key's traffic (150/s against 100/s) from eu-west to us-east on a
// two-region core ticked every tickEvery, every version acknowledged by eu-west's enforcer
// 350 ms after it and by us-east's 500 ms after it; it returns when us-east's share reached 0.95 after the move
// and when the versions after the move were published, failing t if it never did.
func moveOnce(t *testing.T, tickEvery time.Duration) (time.Duration, []time.Time) {
	t.Helper()
	c := newTestCore(t, func(c *CoreConfig) { c.Regions = regions3[:2]; c.KeyTTL = time.Hour })
	now := t0
	seq := uint64(0)
	send := func(region string, u ...*allotv1.IdentityUsage) {
		seq++
		if err := c.Ingest(now, recentReport(region, region+"-1", seq, now, c.Stats(now).Version, u...)); err != nil {
			t.Fatal(err)
		}
	}
	tick := func() { tickPublished(c, now) }
	// A minute of all traffic in eu-west (150/s against 100/s).
	for i := range 60 {
		now = now.Add(time.Second)
		if i%5 == 0 {
			send("us-east")
			send("eu-west", useRecent("key:a", 1000, 500, 150))
		}
		tick()
	}
	if s, _ := c.Identity("default", "key:a"); s.Published[1] < 0.95 {
		t.Fatalf("before the move: %v, want eu-west ≈ 0.99", s.Published)
	}
	moved := now
	// The traffic moves to us-east. Its enforcer reports early 0.5 s later (refusals
	// jumped): its interval's average is 15/s, its recent rate 150/s.
	now = now.Add(500 * time.Millisecond)
	r := recentReport("us-east", "us-east-1", 100, now, c.Stats(now).Version, useRecent("key:a", 1, 74, 150))
	r.Early = true
	if err := c.Ingest(now, r); err != nil {
		t.Fatal(err)
	}
	// Every tickEvery: tick; eu-west acknowledges each new version 500 ms after it (its
	// recent rate 0), us-east too.
	type ackAt struct {
		at  time.Time
		ver uint64
	}
	var acks []ackAt // eu-west's, then us-east's 150 ms later
	var versions []time.Time
	lastVer := c.Stats(now).Version
	for now.Sub(moved) < 5*time.Second {
		tick()
		if v := c.Stats(now).Version; v != lastVer {
			acks = append(acks, ackAt{now.Add(350 * time.Millisecond), v}, ackAt{now.Add(500 * time.Millisecond), v})
			versions = append(versions, now)
			lastVer = v
		}
		for len(acks) > 0 && !acks[0].at.After(now) {
			v, eu := acks[0].ver, len(acks)%2 == 0
			acks = acks[1:]
			seq++
			a := recentReport("eu-west", "eu-west-1", seq, now, v, useRecent("key:a", 10, 0, 0))
			if !eu {
				a = recentReport("us-east", "us-east-1", seq, now, v, useRecent("key:a", 50, 50, 150))
			}
			a.Ack = true
			_ = c.Ingest(now, a)
		}
		if s, _ := c.Identity("default", "key:a"); s.Published[0] >= 0.95 {
			t.Logf("us-east at %v %.0f ms after the move (versions %d at %v)", s.Published, float64(now.Sub(moved))/1e6, c.Stats(now).Version, versions)
			return now.Sub(moved), versions
		}
		now = now.Add(tickEvery)
	}
	s, _ := c.Identity("default", "key:a")
	t.Fatalf("5 s after the move: %v, want us-east ≥ 0.95", s.Published)
	return 0, nil
}

// Noise is not a move: Poisson recent rates around a steady split over the key's limit
// never ask for a shift recompute (once the key's arrival has been recomputed).
func TestRecentNoiseIsNotAShift(t *testing.T) {
	c := newTestCore(t, func(c *CoreConfig) { c.KeyTTL = time.Hour })
	rng := rand.New(rand.NewPCG(3, 4))
	poisson := func(mean float64) float64 { // normal approximation, enough for λ ≥ 10
		return max(0, mean+rng.NormFloat64()*math.Sqrt(mean))
	}
	now := t0
	seq := uint64(0)
	shifts := 0
	for i := range 600 {
		now = now.Add(time.Second)
		for r, name := range regions3 {
			if i%3 != r {
				continue
			}
			// us-east 60/s, eu-west 20/s, ap-south 0 against 50/s: three enforcers each.
			rate := []float64{60, 20, 0}[r]
			for e := range 3 {
				seq++
				// Each enforcer reports every 3 s, over the 3 s since its last report.
				rep := recentReport(name, name+string(rune('0'+e)), seq, now, c.Stats(now).Version,
					useRecent("key:a", rate, 0, poisson(rate/3)))
				rep.IntervalStartMs = now.Add(-3 * time.Second).UnixMilli()
				_ = c.Ingest(now, rep)
				c.mu.Lock()
				if c.shiftPending {
					if i >= 30 { // the key's arrival, before its first recompute, is a move
						shifts++
					}
					c.shiftPending = false
				}
				c.mu.Unlock()
			}
		}
		if p := c.Tick(now); p != nil {
			c.Published(p, now)
		}
	}
	if shifts > 0 {
		t.Fatalf("%d shift recomputes asked for by noise in 10 minutes of steady traffic", shifts)
	}
}

// A quiet entry (no tokens: the pair's traffic stopped since the enforcer's last report)
// carries only a recent rate: it never makes an identity the balancer did not track, so
// an enforcer cannot grow the balancer's table with entries that say nothing.
func TestQuietEntryTracksNothingNew(t *testing.T) {
	c := newTestCore(t, nil)
	if err := c.Ingest(t0, recentReport("us-east", "us-east-0", 1, t0, 0, useRecent("key:q", 0, 0, 50))); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Identity("default", "key:q"); ok {
		t.Fatal("a quiet entry made an identity")
	}
}

// A partial move is read from the answers to the version it caused (issue 21 §2): the
// traffic of a key over its limit swaps between two regions (120/s and 30/s against
// 100/s: 0.7/0.3 max-min fair). The early recompute sees the region the traffic reached, not the one it left
// (whose last report is from before), and splits 50/50; the reports that answer that
// version carry every region's last second, and the follow-up recompute reads the new
// split from them (0.3/0.7) a round trip later instead of at the next interval.
func TestPartialMoveFollowedUpFromTheAnswers(t *testing.T) {
	g := newSwapRig(t, false, 30, 120)
	if s, _ := g.c.Identity("default", "key:a"); math.Abs(s.Published[1]-0.7) > 0.03 {
		t.Fatalf("before the move: %v, want eu-west ≈ 0.7 (max-min fair)", s.Published)
	}
	moved := g.swap()
	g.now = g.now.Add(2 * time.Second)
	g.send("us-east", true, false) // refusals jumped
	g.answerUntilMoved(moved, map[string]time.Duration{"us-east": 300 * time.Millisecond, "eu-west": 300 * time.Millisecond})
}

// A plan's continuation leaves a pending follow-up pending. The shift's recompute reads
// the region the traffic left from its window (its reports predate the move) and
// publishes its decrease; that region's answer, carrying its new rate, releases the
// increase at once (a continuation), before the region the traffic reached has answered.
// That continuation once cancelled the follow-up which reads every region's answer, and
// the key stayed at the shift's 50/50 split until the next interval (10–15 s in
// many-keys).
func TestAContinuationKeepsTheFollowUp(t *testing.T) {
	g := newSwapRig(t, true, 30, 120)
	moved := g.swap()
	g.now = g.now.Add(500 * time.Millisecond)
	g.send("us-east", false, false) // the arrival: a shift
	g.answerUntilMoved(moved, map[string]time.Duration{"eu-west": 300 * time.Millisecond, "us-east": 1200 * time.Millisecond})
}

// swapRig is a key over its limit (100/s) in two regions, each of one enforcer: a minute
// of 30/s in us-east and 120/s in eu-west, reported every 10 s, before swap.
type swapRig struct {
	t      *testing.T
	c      *Core
	now    time.Time
	seq    uint64
	counts bool // reports carry recent_tokens (one second's)
	rates  map[string]float64
	drain  map[string]bool // its reports say the region's bucket went under half
	last   map[string]time.Time
}

// newSwapRig is a two-region core that has heard key:a (a 100/s limit) at usEast and
// euWest tokens a second for a minute, a report from each region every 10 s.
func newSwapRig(t *testing.T, counts bool, usEast, euWest float64) *swapRig {
	g := &swapRig{t: t, c: newTestCore(t, func(c *CoreConfig) { c.Regions = regions3[:2]; c.KeyTTL = time.Hour }),
		now: t0, counts: counts, rates: map[string]float64{"us-east": usEast, "eu-west": euWest},
		drain: map[string]bool{}, last: map[string]time.Time{"us-east": t0, "eu-west": t0}}
	for i := range 60 {
		g.now = g.now.Add(time.Second)
		if i%10 == 9 {
			g.send("us-east", false, false)
			g.send("eu-west", false, false)
		}
		g.tick()
	}
	return g
}

// swap moves the traffic (us-east 120/s, eu-west 30/s) and returns when.
func (g *swapRig) swap() time.Time {
	g.rates["us-east"], g.rates["eu-west"] = 120, 30
	return g.now
}

func (g *swapRig) send(region string, early, ack bool) {
	g.seq++
	secs := g.now.Sub(g.last[region]).Seconds()
	g.last[region] = g.now
	tok := g.rates[region] * secs
	u := useRecent("key:a", min(tok, 100*secs/2), max(tok-100*secs/2, 0), g.rates[region])
	if g.counts {
		u.RecentTokens = g.rates[region]
	}
	u.Draining = g.drain[region]
	r := recentReport(region, region+"-1", g.seq, g.now, g.c.Stats(g.now).Version, u)
	r.IntervalStartMs = g.now.Add(-time.Duration(secs * float64(time.Second))).UnixMilli()
	r.Early, r.Ack = early, ack
	if err := g.c.Ingest(g.now, r); err != nil {
		g.t.Fatal(err)
	}
}

func (g *swapRig) tick() {
	if p := g.c.Tick(g.now); p != nil {
		g.c.Published(p, g.now)
	}
}

// answerUntilMoved ticks every 250 ms, each region answering every new version after its
// delay, until us-east holds 0.68: within 4 s of moved, or the test fails.
func (g *swapRig) answerUntilMoved(moved time.Time, delay map[string]time.Duration) {
	t, c := g.t, g.c
	lastVer := c.Stats(g.now).Version
	answerAt := map[string]time.Time{}
	for g.now.Sub(moved) < 8*time.Second {
		g.tick()
		if v := c.Stats(g.now).Version; v != lastVer {
			lastVer = v
			for r, d := range delay {
				answerAt[r] = g.now.Add(d)
			}
		}
		for _, r := range c.cfg.Regions {
			if at, ok := answerAt[r]; ok && !g.now.Before(at) {
				g.send(r, false, true)
				delete(answerAt, r)
			}
		}
		if s, _ := c.Identity("default", "key:a"); s.Published[0] >= 0.68 {
			t.Logf("us-east at %v %.0f ms after the move (versions %d, follow-ups %d)", s.Published, float64(g.now.Sub(moved))/1e6, c.Stats(g.now).Version, c.Stats(g.now).FollowUps)
			if d := g.now.Sub(moved); d > 4*time.Second {
				t.Fatalf("us-east reached 0.68 %v after the move, want ≤ 4 s", d)
			}
			return
		}
		g.now = g.now.Add(250 * time.Millisecond)
	}
	s, _ := c.Identity("default", "key:a")
	t.Fatalf("8 s after the move: %v (follow-ups %d), want us-east ≥ 0.68", s.Published, c.Stats(g.now).FollowUps)
}

// learnedCore is a core of two regions past its learning period (its first recompute
// done at the returned time), key:a heard at 30/s in each.
func learnedCore(t *testing.T) (*Core, time.Time) {
	t.Helper()
	c := newTestCore(t, func(c *CoreConfig) { c.Regions = regions3[:2] })
	now := t0.Add(10 * time.Second)
	for i, r := range c.cfg.Regions {
		if err := c.Ingest(now, recentReport(r, r+"-1", uint64(i+1), now, 0, useRecent("key:a", 300, 0, 30))); err != nil {
			t.Fatal(err)
		}
	}
	if p := c.Tick(now); p != nil { // learning ends: the first recompute
		c.Published(p, now)
	}
	return c, now
}

// TestFollowUpsNeverStarveTheInterval: on 10,000 keys' noise every follow-up's snapshot
// showed some key moved, so each follow-up's version asked for the next and, taken before
// the interval's recompute, the chain held it off for good (three recomputes in ten
// minutes; tail keys kept the default split). The interval's recompute comes first.
func TestFollowUpsNeverStarveTheInterval(t *testing.T) {
	c, now := learnedCore(t)
	before := c.Stats(now)
	c.mu.Lock()
	c.followUp = true // a chain in progress, its answers in
	due := c.nextDue
	c.mu.Unlock()
	c.Tick(due)
	after := c.Stats(due)
	if after.Recomputes != before.Recomputes+1 || after.FollowUps != before.FollowUps {
		t.Fatalf("at the interval with a follow-up pending: recomputes %d → %d, follow-ups %d → %d; want the interval's recompute",
			before.Recomputes, after.Recomputes, before.FollowUps, after.FollowUps)
	}
}

// The interval's recompute that takes a pending follow-up's place and changes nothing
// leaves the follow-up pending: without a version there are no answers to follow it up
// by, and the move's own snapshot is still the one to read. Seen in many-keys: a 50/s
// key's swap was read at 50/50 (the region the traffic left from its window), the
// interval fell due 0.2 s later and changed nothing, and the follow-up that would have
// read that region's answers was dropped: 50/50 for 10 s, a 12 s move.
func TestANoOpIntervalKeepsTheFollowUp(t *testing.T) {
	c, now := learnedCore(t)
	before := c.Stats(now)
	c.mu.Lock()
	c.followUp = true // a move's version out, its answers not all in
	due := c.nextDue
	c.mu.Unlock()
	if p := c.Tick(due); p != nil && p.Changed {
		t.Fatalf("the interval with no new reports published version %d, want no change", p.Head.Version)
	}
	c.mu.Lock()
	pending := c.followUp
	c.mu.Unlock()
	if !pending {
		t.Fatal("the follow-up was dropped by an interval recompute that changed nothing")
	}
	later := due.Add(c.cfg.EarlyGap) // no answers: the follow-up runs once EarlyGap has passed
	c.Tick(later)
	if after := c.Stats(later); after.Recomputes != before.Recomputes+1 || after.FollowUps != before.FollowUps+1 {
		t.Fatalf("recomputes %d → %d, follow-ups %d → %d; want the interval's recompute, then the follow-up",
			before.Recomputes, after.Recomputes, before.FollowUps, after.FollowUps)
	}
}

// A shift whose recompute falls due with the interval is followed up like any other: it
// read the region the traffic left from its window (seen in many-keys: a swap at an
// interval's boundary held 50/50 for 14 s).
func TestAShiftDueWithTheIntervalIsFollowedUp(t *testing.T) {
	c, _ := learnedCore(t)
	c.mu.Lock()
	due := c.nextDue
	c.mu.Unlock()
	u := useRecent("key:a", 300, 900, 150)
	u.RecentTokens = 150
	if err := c.Ingest(due, recentReport("us-east", "us-east-1", 9, due, c.Stats(due).Version, u)); err != nil {
		t.Fatal(err)
	}
	if p := c.Tick(due); p == nil || !p.Changed {
		t.Fatalf("the interval with a shift pending: %+v, want a new version", p)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.followUp {
		t.Fatal("a shift's version at the interval is not followed up")
	}
}

// A moved region is read from the report that showed the move, not from the mean of the
// window's recent rates, which still holds its reports from before (a region whose 15/s
// became 60/s was read at 21.8).
func TestAMoveIsReadFromTheReportThatShowedIt(t *testing.T) {
	c, now := learnedCore(t)
	now = now.Add(time.Second)
	if err := c.Ingest(now, recentReport("us-east", "us-east-1", 3, now, c.Stats(now).Version, useRecent("key:a", 30, 0, 30))); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Second)
	u := useRecent("key:a", 40, 80, 150)
	u.RecentTokens = 150
	if err := c.Ingest(now, recentReport("us-east", "us-east-1", 4, now, c.Stats(now).Version, u)); err != nil {
		t.Fatal(err)
	}
	now = now.Add(c.cfg.ShiftGap)
	if p := c.Tick(now); p != nil {
		c.Published(p, now)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	id := c.ids[key{"default", "key:a"}]
	if got := id.st.Smoothed[0]; math.Abs(got-150) > 1e-9 {
		t.Fatalf("us-east read at %.1f/s after the move, want 150 (the report that showed it; the window's mean is 90)", got)
	}
}

// A move is settled: SettleAfter after the recompute a move asked for, the window since
// (every enforcer's reports of those seconds) is read, not left until the interval's
// recompute. Here the region the traffic left answered the move's version with a noisy
// second (60/s where 10/s came), which held a 100/s key over its limit at 50/50; three
// seconds of its reports at 10/s give the region the traffic came to its part.
func TestAMoveIsSettledFromTheWindowAfterIt(t *testing.T) {
	c := newTestCore(t, func(c *CoreConfig) { c.Regions = regions3[:2]; c.KeyTTL = time.Hour })
	now := t0
	seq := uint64(0)
	send := func(region string, admitted, refused, recent float64, early bool) {
		seq++
		u := useRecent("key:a", admitted, refused, recent)
		u.RecentTokens = recent
		r := recentReport(region, region+"-1", seq, now, c.Stats(now).Version, u)
		r.IntervalStartMs = now.Add(-500 * time.Millisecond).UnixMilli()
		r.Early = early
		if err := c.Ingest(now, r); err != nil {
			t.Fatal(err)
		}
	}
	tick := func() { tickPublished(c, now) }
	// A minute of 120/s in eu-west and 30/s in us-east, a report every 500 ms.
	for range 120 {
		now = now.Add(500 * time.Millisecond)
		send("us-east", 15, 0, 30, false)
		send("eu-west", 60, 0, 120, false)
		tick()
	}
	// They swap. us-east's refusals show it a second later; eu-west answers the move's
	// versions with a second that still holds 60/s, then reports its 10/s.
	now = now.Add(time.Second)
	send("us-east", 20, 40, 120, true)
	send("eu-west", 30, 0, 60, false)
	tick()
	s, _ := c.Identity("default", "key:a")
	moved := now
	for now.Sub(moved) < c.cfg.Interval/2 {
		now = now.Add(500 * time.Millisecond)
		send("us-east", 25, 35, 120, false)
		if now.Sub(moved) <= time.Second {
			send("eu-west", 30, 0, 60, false)
		} else {
			send("eu-west", 5, 0, 10, false)
		}
		tick()
		if s, _ = c.Identity("default", "key:a"); s.Published[0] >= 0.75 {
			break
		}
	}
	t.Logf("%v after the move's recompute: %v (settles %d)", now.Sub(moved), s.Published, c.Stats(now).Settles)
	if got := s.Published[0]; got < 0.75 {
		t.Fatalf("us-east at %.2f %v after the move, want ≥ 0.75 (eu-west's 10/s settled)", got, now.Sub(moved))
	}
	if d := now.Sub(moved); d > SettleAfter+time.Second {
		t.Fatalf("us-east reached 0.75 %v after the move, want ≤ SettleAfter + 1 s", d)
	}
}

// A key under its limit whose traffic swaps between its regions (12 and 48 of 100/s) moves
// on the report that shows the new region spending its burst, before anything is refused
// there: a region above its share of an established key whose enforcer saw its bucket
// under half (IdentityUsage.draining) is an arrival whether or not it was refused yet
// (shifted). Before, the move waited for the region's refusals (about 1.7 s after the
// swap in many-keys' key14) or, here, where none come, for the interval's recompute;
// without the draining flag it still does (the rate alone is too noisy a test over
// 10,000 keys).
func TestABurstSpentUnderTheLimitIsAMove(t *testing.T) {
	for _, draining := range []bool{false, true} {
		g := newSwapRig(t, true, 12, 48)
		published := func() []float64 {
			s, _ := g.c.Identity("default", "key:a")
			return s.Published
		}
		step := func(d time.Duration) { // both regions report, the core ticks
			g.now = g.now.Add(d)
			g.send("us-east", false, false)
			g.send("eu-west", false, false)
			g.tick()
		}
		if p := published(); p[0] > 0.35 {
			t.Fatalf("before the swap us-east holds %.2f, want it near its 12/s", p[0])
		}
		// Swap right after an interval's recompute: that recompute does not find it.
		for r := g.c.Stats(g.now).Recomputes; g.c.Stats(g.now).Recomputes == r; {
			step(500 * time.Millisecond)
		}
		g.rates["us-east"], g.rates["eu-west"] = 48, 12
		g.drain["us-east"] = draining
		swapped := g.now
		step(500 * time.Millisecond) // us-east's report: its burst is half spent
		for g.now.Sub(swapped) < 3*time.Second && published()[0] < 0.45 {
			step(250 * time.Millisecond)
		}
		p := published()
		t.Logf("draining %v: %v after the swap: %.3f", draining, g.now.Sub(swapped), p)
		if draining && p[0] < 0.45 {
			t.Fatalf("us-east at %.2f 3 s after a swap to 48/s reported draining, want ≥ 0.45", p[0])
		}
		if !draining && p[0] >= 0.45 {
			t.Fatalf("us-east at %.2f within 3 s of a swap with nothing refused nor draining, want it held to the interval", p[0])
		}
	}
}
