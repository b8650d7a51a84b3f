package balancer

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/share"
)

// Tick, the core's clock: once the learning period is over and an interval is due (or a
// report asked for one early) it recomputes every identity's target from the window's
// demand (recompute, through pkg/share), steps the change plan (plan.go), and returns the
// publication to write (materialize).

// Tick advances the core to now and returns what to write, or nil when nothing is due.
// It recomputes every identity's target when an interval is due (or ShiftGap after the
// last recompute when a report showed a key's traffic moved), once the learning period
// is over; it advances every change plan whose acknowledgements moved; and it returns a Changed
// publication (Version+1, every identity that differs from the default split) when some
// published share changed or this term has not written yet, else a head refresh once per
// Interval. While a changed version has not been confirmed by Published, Tick returns it
// again (same version, the write is retried) and makes no new one.
func (c *Core) Tick(now time.Time) *Publication {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.begin(now)
	if c.version > c.landed && !c.dirty {
		return c.materialize(now, true) // the last write did not land: retry it
	}
	ack := c.acks(now)
	if c.learning {
		all := true
		for i := range c.regions {
			all = all && c.regions[i].heard
		}
		if all || now.Sub(c.start) >= c.cfg.Learning {
			c.learning = false
			c.nextDue = now // recompute at once
		}
	}
	recomputed, shift, follow := false, false, false
	since := now.Sub(c.lastCompute)
	settle := !c.settleAt.IsZero() && !now.Before(c.settleAt)
	interval := !now.Before(c.nextDue)
	due := interval || settle
	if !c.learning && !due && c.followUp && (c.answered(now) || now.Sub(c.lastVersionAt) >= c.cfg.EarlyGap) {
		// The last version came from a recompute and every region has answered it (or
		// EarlyGap passed): its reports are a fresh second of every region's traffic. The
		// interval's recompute comes first: a follow-up never holds it up (a chain of them
		// on 10,000 keys' noise once starved it: three recomputes in ten minutes).
		follow = true
		c.followUp = false
		c.recompute(now, true)
		recomputed = true
	} else if !c.learning && (due || (c.shiftPending && since >= c.cfg.ShiftGap)) {
		shift = c.shiftPending
		// Asked for by a report (a shift, even one that falls due with the interval), or
		// due while the follow-up of one was pending: such a recompute reads the region
		// the traffic left from its window (a key held 10–15 s at 50/50), and its
		// answers must follow it up.
		c.asked = !due || shift || c.followUp
		c.followHeld = c.followUp
		c.followUp, c.followDepth = false, 0
		c.recompute(now, false)
		recomputed = true
		if settle && !interval && !shift {
			c.stats.settles++
		}
		c.settleAt = time.Time{}
		if shift {
			c.settleAt = now.Add(SettleAfter)
		}
	}
	// A new version at most every MinVersionGap (the first of a term aside): each one
	// writes its changed chunks (every chunk at worst), so this bounds the bytes written
	// per interval. Two kinds go out as soon as they are due, so that a move costs one
	// acknowledged round trip rather than waits for slots: a plan's continuation, while
	// the last version held increases back (it needs a report round trip after the
	// version before it), and the result of a recompute asked for by a shift (at most one
	// per ShiftGap).
	changed := false
	c.fullStep = c.fullStep || recomputed
	c.shiftStep = c.shiftStep || shift || follow
	gap := c.cfg.MinVersionGap
	if c.held || c.shiftStep {
		gap = c.cfg.StepGap
	}
	fromRecompute := false
	if c.lastVersionAt.IsZero() || now.Sub(c.lastVersionAt) >= gap {
		p := c.planFor(ack)
		fromRecompute = c.fullStep
		changed = c.advance(&p, c.fullStep)
		if fromRecompute {
			// A version out of a recompute is followed up once its answers are in (a
			// follow-up's own version only when the snapshot moved some identity: the chain
			// ends when the newest picture agrees with the window's). At most MaxFollowUps
			// follow a recompute. A plan's continuation leaves a pending follow-up pending:
			// its answers are the fresher snapshot (a shift's decrease, continued 0.5 s
			// later, once cancelled the follow-up that would have read the region the
			// traffic left, and held a key at 50/50 for 10 s). A recompute that took a
			// pending follow-up's place (the interval's, due just after a move's version)
			// and changed nothing has no answers to follow it up by: the move's follow-up
			// stays pending (dropped, it held a 50/s key at 50/50 for 10 s).
			c.followUp = changed && (!follow && c.asked || follow && c.snapMoves > 0 && c.followDepth < MaxFollowUps) ||
				!changed && c.followHeld
			c.followHeld = false
		}
		c.fullStep, c.shiftStep = false, false
	}
	if changed || c.dirty {
		if follow {
			c.followDepth++
		}
		c.snapEpoch++
		c.dirty = false
		c.lastVersionAt = now
		c.versionsAt[c.versionsNext] = now
		c.versionsNext = (c.versionsNext + 1) % quickSteps
		c.version++
		c.log = append(c.log, verEntry{v: c.version})
		c.trimLog(ack)
		return c.materialize(now, true)
	}
	if c.lastHeadAt.IsZero() || now.Sub(c.lastHeadAt) >= c.cfg.Interval {
		return c.materialize(now, false)
	}
	return nil
}

// quickSteps: while fewer versions than this were made in the last Interval, a plan's
// next step is taken as soon as StepGap allows (NextTick).
const quickSteps = 4

// NextTick is the soonest instant after now at which Tick may take a plan's next step
// that it could not take at now (StepGap after the last version), while the control
// plane is quiet (fewer than quickSteps versions in the last Interval); zero otherwise.
// balancer.Service (and regionsim) tick then when it is sooner than TickEvery. An
// acknowledgement that kicked a tick before StepGap had passed otherwise left the step
// to the next TickEvery, a second later: live, the demo's move went in steps a second
// apart where the acknowledgements came every 0.3 s (acme 4 s to 95%, 2 s now). Busy, the
// steps of many plans are batched at TickEvery as before: stepping every StepGap, the
// 10,000-key population wrote 13.7 versions an interval instead of 8.3.
func (c *Core) NextTick(now time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.learning || !(c.held || c.shiftStep) {
		return time.Time{}
	}
	oldest := c.versionsAt[c.versionsNext] // the quickSteps-th last version's
	if !oldest.IsZero() && now.Sub(oldest) < c.cfg.Interval {
		return time.Time{}
	}
	if at := c.lastVersionAt.Add(c.cfg.StepGap); at.After(now) {
		return at
	}
	return time.Time{}
}

// answered reports whether every enforcer that may still enforce something (heard within
// SilentAfter) has reported since the last new version: its snapshot of recent rates is
// then complete.
func (c *Core) answered(now time.Time) bool {
	for r := range c.regions {
		rs := &c.regions[r]
		for _, e := range rs.enforcers {
			if e.live(now, c.cfg.SilentAfter) && e.snapOf != c.snapEpoch+1 {
				return false
			}
		}
	}
	return true
}

// recompute sets every identity's target from this window's demand and closes the
// window. With snapshot (a follow-up of a version, see Core.followUp) an identity whose
// recent rates since that version differ, in some region, from the window's average by
// more than their noise is read from those recent rates in every region that reported
// them: its traffic moved, and the newest picture of it is one second old at most.
func (c *Core) recompute(now time.Time, snapshot bool) {
	n := c.n
	c.snapUsed, c.snapMoves = 0, 0
	if snapshot {
		c.stats.followUps++
	} else {
		c.stats.recomputes++
	}
	perEnf := make([]float64, n)  // D_r, seconds; NaN: region not heard this window
	weight := make([]float64, n)  // the EWMA weight of a window D_r long (share.Input.Weight)
	perRep := make([]float64, n)  // enforcers per report this window: Σ recent × perRep
	snapRep := make([]float64, n) // the same for the reports since the last version (snapshot)
	silent := make([]bool, n)
	stale := make([]bool, n)
	for r := range c.regions {
		rs := &c.regions[r]
		perEnf[r] = math.NaN()
		perRep[r] = math.NaN()
		if rs.winEnfs > 0 {
			// The region's rate is the mean rate per enforcer-second of this window's
			// reports times the enforcers serving the region now (heard within
			// SilentAfter): a window in which only some of them reported — recomputes
			// come every few seconds on shifts — is not read as the region's
			// traffic having fallen by the part of those that did not.
			live := 0
			for _, e := range rs.enforcers {
				if e.live(now, c.cfg.SilentAfter) {
					live++
				}
			}
			live = max(live, rs.winEnfs)
			perEnf[r] = rs.winSecs / float64(live)
			weight[r] = share.WindowWeight(c.cfg.Share.Alpha, perEnf[r]/c.cfg.Interval.Seconds())
			if rs.winRecent == rs.winReports { // else an older enforcer's report: no recent rates
				perRep[r] = float64(live) / float64(rs.winReports)
			}
		}
		snapRep[r] = math.NaN()
		if snapshot && rs.snapOf == c.snapEpoch && rs.snapReports > 0 {
			live := 0
			for _, e := range rs.enforcers {
				if e.live(now, c.cfg.SilentAfter) {
					live++
				}
			}
			snapRep[r] = float64(max(live, rs.snapEnfs)) / float64(rs.snapReports)
		}
		last := rs.lastHeard
		if last.IsZero() || last.Before(c.start) {
			last = c.start
		}
		// A region not heard yet in this term is held too: a new leader does not know what
		// it enforces (it may be cut off, applying an old leader's larger share).
		silent[r] = !rs.heard || now.Sub(last) > c.cfg.SilentAfter
		stale[r] = now.Sub(last) >= c.cfg.Stale
		if !snapshot {
			rs.driftSum, rs.driftMax = 0, 0
		}

	}
	demand := make([]float64, n)
	noise := make([]float64, n)
	held := make([]float64, n)
	unseen := c.coverSince(now)
	wy := make([]float64, n)    // a young identity's weights (its demand is read since it appeared)
	cover := make([]float64, n) // a young identity's seconds per enforcer of each region's reports since it appeared
	nonDefault := 0
	for _, id := range c.all {
		tok := id.tokens(n)
		if l, ok := c.cfg.Limits(id.k.rule, id.k.identity); ok && l.Rate > 0 && !math.IsInf(l.Rate, 0) && (l.Default == nil || len(l.Default) == n) {
			def := l.Default
			if def == nil {
				def = c.weights
			}
			id.rate, id.requests, id.def, id.global = l.Rate, l.Requests, def, l.Global
		} else {
			id.evict = true // the rule is gone: back to the default split, then forget it
		}
		if snapshot && (id.evict || id.snapOf != c.snapEpoch) {
			continue // a follow-up touches only what its snapshot names
		}
		seen := id.lastSeen
		if seen.Before(c.start) {
			seen = c.start
		}
		tgt := id.target(n)
		if id.evict || now.Sub(seen) >= c.cfg.KeyTTL {
			id.evict = true
			copy(tgt, id.def)
			clear(tok)
			clear(id.recent(n))
			id.shift, id.moved, id.estSet = false, 0, 0
			continue
		}
		// A silent region is held at its last published share (the others' targets get
		// the rest; if it may still apply an older, larger one, share.Step keeps their
		// increases back until that is acknowledged), after Stale at min(last, default).
		pub := id.published(n)
		rec := id.recent(n)
		most := 0.0 // the busiest region's demand, read or smoothed, or its life's two deviations low (unseenCover.hold)
		young := id.young(now)
		// A young key that has not moved is read from every report since it appeared: its
		// windows since the last recompute are a second or less when recomputes come
		// often, and a count of two read as 4/s of a 0.5/s key gave its region the whole
		// limit. Once its traffic moves the window's reading is the newer one.
		lifelong := young && !snapshot && !id.shift && id.moved == 0 && !id.lifeOff
		life, bornAt := id.life(n), id.born.Sub(c.start).Seconds()
		if lifelong {
			for r := range n {
				cover[r] = unseen.since(r, bornAt)
			}
		}
		if lifelong && lifeMoved(tok, perEnf, life, cover) {
			// Its window reads, somewhere, other than its life so far: it moved (a shift
			// the recent rates did not show). The windows are the newer reading from now on.
			lifelong, id.lifeOff = false, true
		}
		wgt := weight
		if lifelong {
			copy(wy, weight)
			wgt = wy
		}
		for r := range n {
			demand[r] = tok[r] / perEnf[r] // NaN when not heard
			// The window's tokens are Poisson counts: the rate's standard deviation (the
			// policy carries it through the smoothing; a region not heard keeps both).
			noise[r] = math.Sqrt(max(tok[r], 1)) / perEnf[r]
			if lifelong {
				if cover[r] > 0 {
					demand[r] = life[r] / cover[r]
					noise[r] = math.Sqrt(max(life[r], 1)) / cover[r]
					wy[r] = 1 // the life's reading replaces the smoothed demand
				}
				// The busiest region's rate two deviations low: a clump of a new key's
				// first second is not the rate its other regions are tested at (hold).
				if d := demand[r] - 2*noise[r]; d > most {
					most = d
				}
			} else {
				if d := demand[r]; d > most { // NaN compares false
					most = d
				}
				most = max(most, id.smoothedAt(r))
			}
			if r < 64 && id.estSet&(1<<r) != 0 && !snapshot {
				// The report that showed the move: one enforcer's second, times the
				// region's enforcers (its noise, √(enforcers × rate)).
				est := id.moveEst(n)[r]
				demand[r] = est
				noise[r] = math.Sqrt(max(est, 1) * float64(max(1, len(c.regions[r].enforcers))))
			} else if id.moved&regionBit(r) != 0 && !math.IsNaN(perRep[r]) {
				// Its traffic moved here: the region's rate over about the last second (the
				// mean of this window's reports times its enforcers), not the window's
				// average, which still holds the traffic that left or a part of what
				// arrived. The other regions keep the window's average: a second of a
				// region whose traffic did not move is only noisier (a key first heard of
				// was given a 2σ-high second in one region and kept it for 18 s).
				demand[r] = rec[r] * perRep[r]
				noise[r] = math.Sqrt(max(demand[r], 1)) // about one second of arrivals
			}
			if id.rate*c.cfg.Interval.Seconds() < 10 {
				// A limit of fewer than ten requests an interval (a few a minute) is all
				// noise next to a second's Poisson floor; its burst is handed out in whole
				// requests (quantise), which has its own hysteresis.
				noise[r] = 0
			}
			held[r] = math.NaN()
			if silent[r] {
				held[r] = pub[r]
				if stale[r] {
					held[r] = min(pub[r], id.def[r])
				}
			}
		}
		if young {
			unseen.hold(id, most, demand, held, pub)
		}
		var fast bool
		if snapshot {
			// A follow-up leaves the window to the next recompute: only the identities
			// its snapshot shows moved (or refines after a move) are allocated again, from
			// that snapshot alone (a region without one keeps its smoothed demand).
			var use bool
			if use, fast = c.fromSnapshot(id, demand, noise, held, snapRep); !use {
				continue
			}
		} else {
			clear(tok)
			clear(rec)
			id.estSet = 0
			// A move takes the policy's fast path whatever the noise. The regions it
			// showed in stay read by their recent rates while the moves go on (a
			// recompute a moment later, on the acknowledgements, has a window that still
			// holds the time before the traffic arrived); the first recompute without a
			// move reads window averages.
			fast = id.shift
			if !fast {
				id.moved = 0
			}
		}
		id.shift = false
		// In place: id.st is this identity's alone, and its Shares are copied out below.
		id.st, _ = share.AllocateInto(id.st, c.cfg.Share, id.st, share.Input{Limit: id.rate, Demand: demand, Default: id.def, Held: held, Noise: noise, Weight: wgt, Fast: fast})
		copy(tgt, id.st.Shares)
		if id.requests > 0 && id.requests < SmallBurst {
			quantise(tgt, held, id.st.Smoothed, pub, id.requests)
		}
		if !equal(tgt, id.def) {
			nonDefault++
		}
		if !snapshot {
			c.drift(id)
		}
	}
	if snapshot {
		return // the window stays open for the next recompute
	}
	if nonDefault > c.cfg.MaxPublished {
		c.capPublished()
	}
	c.capTracked()
	for r := range c.regions {
		c.regions[r].winSecs, c.regions[r].winEnfs, c.regions[r].winReports, c.regions[r].winRecent = 0, 0, 0, 0
	}
	c.window++
	c.shiftPending = false
	c.lastCompute = now
	for !c.nextDue.After(now) {
		c.nextDue = c.nextDue.Add(c.cfg.Interval)
	}
}

// SettleAfter is how long after a recompute a move asked for the next one comes (a
// settle recompute, due as the interval's is; any recompute of the window before it
// stands in for it). A move is read from about a second of one or a few enforcers'
// recent rates, and a region the traffic left from a window that still held the time
// before; the settle recompute reads the window since, every enforcer's reports of those
// seconds, and its version is followed up like the interval's. Without it such a reading
// stood until the interval's recompute: a 15/s region read at 26/s held a 50/s key over
// its limit at 50/50 for 10 s.
const SettleAfter = 3 * time.Second

// The follow-up's move test (fromSnapshot) and chain length (Tick).
const (
	followSigmas = 4
	// MaxFollowUps is how many follow-ups may follow one recompute asked for by a report.
	MaxFollowUps = 2
)

// fromSnapshot reads id's demand from the recent rates of the reports since the last
// version (est_r = Σ recent × enforcers ÷ reports: about one second of region r's
// arrivals, at most a second old). Which regions, and how:
//
//   - a move: in some free region est_r differs from the policy's smoothed demand by more
//     than followSigmas standard deviations of a second's Poisson count (√max(est,
//     smoothed, 1)) and by at least DeadBand/4 of the limit. Every region with a snapshot is read from
//     it and the identity takes the policy's fast path (smoothed := est): the traffic
//     moved, and the window's average still holds the time before;
//   - the refinement after a move (id.moved set: the last recompute read it so): the
//     snapshot is the demand, without the fast path, so the policy's smoothing averages
//     the noisy second in with the one before it.
//
// Which way it errs: a second of arrivals is noisier than the window's average — a
// region read at 2σ under its rate after a move is held that much under its fair part
// until the refinement a round trip later; a false move (beyond followSigmas σ) sets a
// region's smoothed demand to a noisy second, which the refinement halves. Over 10,000
// keys × 3 regions a 3σ test finds some 80 false moves in every snapshot (0.27% of
// 30,000 region-keys), and a chain of follow-ups on them never ended; 4σ finds about
// two, and MaxFollowUps ends a chain whatever the noise. (A floor of 10 tokens a second,
// as shifted has, measured no better over six seeds of many-keys and the 10,000-key
// population.)
func (c *Core) fromSnapshot(id *ident, demand, noise, held, snapRep []float64) (use, moved bool) {
	snap := id.snap(c.n, c.snapEpoch)
	for r := range demand {
		if math.IsNaN(snapRep[r]) || !math.IsNaN(held[r]) {
			continue
		}
		est, s := snap[r]*snapRep[r], demand[r]
		if r < len(id.st.Smoothed) && !math.IsNaN(id.st.Smoothed[r]) {
			s = id.st.Smoothed[r]
		}
		if math.IsNaN(s) {
			s = 0
		}
		diff := math.Abs(est - s)
		if diff > followSigmas*math.Sqrt(max(est, s, 1)) && diff >= c.cfg.Share.DeadBand/4*id.rate {
			moved = true
			break
		}
	}
	if !moved && id.moved == 0 {
		return false, false
	}
	c.snapUsed++
	for r := range demand {
		if !math.IsNaN(held[r]) {
			continue
		}
		if math.IsNaN(snapRep[r]) {
			demand[r] = math.NaN() // keeps its smoothed demand
			continue
		}
		demand[r] = snap[r] * snapRep[r]
		noise[r] = math.Sqrt(max(demand[r], 1))
		if moved {
			id.moved |= regionBit(r)
		}
	}
	if moved {
		c.snapMoves++
	}
	return true, moved
}

// drift adds |published − demand fraction| of one identity to each region's drift.
func (c *Core) drift(id *ident) {
	total := 0.0
	for _, d := range id.st.Smoothed {
		if !math.IsNaN(d) {
			total += d
		}
	}
	if total <= 0 {
		return
	}
	pub := id.published(c.n)
	for r := range c.regions {
		x := math.Abs(pub[r] - id.smoothedAt(r)/total)
		c.regions[r].driftSum += x
		c.regions[r].driftMax = max(c.regions[r].driftMax, x)
	}
}

func (c *Core) countListed() int {
	n := 0
	for _, id := range c.all {
		if !equal(id.published(c.n), id.def) {
			n++
		}
	}
	return n
}

func equal(a, b []float64) bool {
	for i := range a {
		if math.Abs(a[i]-b[i]) > eps {
			return false
		}
	}
	return true
}

// materialize builds the publication of the version in force: every identity whose
// published shares differ from its default split, sorted by (rule, identity) so the
// chunks of two versions line up.
func (c *Core) materialize(now time.Time, changed bool) *Publication {
	phase := "target"
	if c.held {
		phase = "decrease"
	}
	p := &Publication{Changed: changed, Head: contract.Head{
		LeaderRev: c.cfg.LeaderRev, Version: c.version, Entries: c.listed, PublishedAt: now,
		Regions: slices.Clone(c.cfg.Regions), Phase: phase,
	}}
	if p.Members = c.members(); p.Members != nil {
		p.membersGen = c.membersGen
	}
	if !changed {
		return p
	}
	p.Entries = make([]contract.Entry, 0, c.listed)
	for _, id := range c.all {
		pub := id.published(c.n)
		if equal(pub, id.def) {
			continue
		}
		k := id.k
		m := make(map[string]float64, c.n)
		for r, name := range c.cfg.Regions {
			m[name] = pub[r]
		}
		p.Entries = append(p.Entries, contract.Entry{Rule: k.rule, Identity: k.identity, Shares: m})
	}
	slices.SortFunc(p.Entries, func(a, b contract.Entry) int {
		return cmp.Or(cmp.Compare(a.Rule, b.Rule), cmp.Compare(a.Identity, b.Identity))
	})
	p.Head.Entries = len(p.Entries)
	return p
}

// YoungFor is how long after a report first named an identity (in this term) a region
// whose reports have not named it may be held for it (unseenCover.hold).
const YoungFor = 20 * time.Second

// UnseenRequests is how many requests a region's reports since an identity appeared
// would have shown, arriving there at its busiest region's rate, before the region is
// read as without it (P(none) = e^-3, 5%).
const UnseenRequests = 3

// unseenCover is, per region, when each of its live enforcers was last heard (seconds
// since the core started, ascending) and the sums of those times from each position on:
// the enforcer-seconds of the region's reports since any instant, in a binary search.
type unseenCover struct {
	start time.Time
	at    [][]float64
	tail  [][]float64 // tail[r][i] = Σ at[r][i:]
}

// since is the seconds per live enforcer that region r's reports cover since born
// (seconds since the core started): those heard before it add nothing.
func (u unseenCover) since(r int, born float64) float64 {
	at := u.at[r]
	if len(at) == 0 {
		return 0
	}
	i, _ := slices.BinarySearch(at, born)
	return (u.tail[r][i] - float64(len(at)-i)*born) / float64(len(at))
}

// lifeMoved is whether, in some region heard this window, the window's reading of an
// identity (tok over perEnf) and the reading of its life so far (life over cover) differ
// by more than three deviations of the difference (Poisson counts: √tokens over their
// seconds).
func lifeMoved(tok, perEnf, life, cover []float64) bool {
	for r := range tok {
		if !(perEnf[r] > 0) || cover[r] <= 0 {
			continue
		}
		w, l := tok[r]/perEnf[r], life[r]/cover[r]
		vw, vl := max(tok[r], 1)/(perEnf[r]*perEnf[r]), max(life[r], 1)/(cover[r]*cover[r])
		if math.Abs(w-l) > 3*math.Sqrt(vw+vl) {
			return true
		}
	}
	return false
}

// young is whether id appeared less than YoungFor before now (in this term).
func (id *ident) young(now time.Time) bool {
	return !id.born.IsZero() && now.Sub(id.born) < YoungFor
}

// coverSince gathers unseenCover at now.
func (c *Core) coverSince(now time.Time) unseenCover {
	u := unseenCover{start: c.start, at: make([][]float64, c.n), tail: make([][]float64, c.n)}
	for r := range c.regions {
		var at []float64
		for _, e := range c.regions[r].enforcers {
			if e.live(now, c.cfg.SilentAfter) {
				at = append(at, e.lastHeard.Sub(c.start).Seconds())
			}
		}
		slices.Sort(at)
		tail := make([]float64, len(at)+1)
		for i := len(at) - 1; i >= 0; i-- {
			tail[i] = tail[i+1] + at[i]
		}
		u.at[r], u.tail[r] = at, tail
	}
	return u
}

// hold holds, at its published share, each free region whose demand for id reads zero
// while its reports since id appeared cover too little to say so: a key new to the
// balancer is first named by the region that reports first, and a recompute then (a
// shift's, or one asked for by another key) read the regions that had not reported
// since as without it and gave them nothing, so every request there was refused until
// their reports and the next recomputes gave some back (a key of 4/s offered about
// 0.6/s in each of three regions, appearing in a running 10,000-key population: ap-south
// at 0 and refused for 33 s). A region is read as without it once, had id arrived there
// at its busiest region's rate, the region's reports since would have shown
// UnseenRequests: rate × Σ_e (heard_e − born) ÷ live enforcers ≥ UnseenRequests. Which
// way it errs: under — for up to YoungFor a key used from one region is held to what
// the regions it does not use leave it (its default split until they have reported
// enough: a 1.5/s key over three regions of three enforcers, about 7 s). Regions past
// the 64th are never held.
func (u unseenCover) hold(id *ident, most float64, demand, held, pub []float64) {
	if !slices.ContainsFunc(demand, func(d float64) bool { return d > 0 }) {
		return // read nowhere this window: nothing to take a region's share for
	}
	born := id.born.Sub(u.start).Seconds()
	for r, d := range demand {
		at := u.at[r]
		// Zero or NaN (not heard this window), and never read above zero.
		if d > 0 || id.smoothedAt(r) > 0 || !math.IsNaN(held[r]) || len(at) == 0 || r >= 64 || id.absent&(1<<r) != 0 {
			continue
		}
		// The region-seconds its reports cover since id appeared (born is when it began to
		// arrive, as read from its first report: firstAge).
		if most*u.since(r, born) < UnseenRequests {
			held[r] = pub[r]
		} else {
			id.absent |= 1 << r // read as without it once: a later window that shows nothing does not hold it again
		}
	}
}
