package balancer

import (
	"hash/fnv"
	"io"
	"math"
	"math/bits"
	"time"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// The tests that read a move from reports' recent rates (Core.usage calls them): a
// region's traffic arrived (one report, several enforcers' reports together, an
// aggregator's merge) or left.

// spread is the enforcers of region r that see the identity's traffic, of its enfs live
// ones: those whose own reports carried traffic of it in this window or the last (see
// ident.carried), the reporting one (bit) included, which it records. The arrival tests
// (arrived, arrivedTogether) read a region's rate from one enforcer's as that rate times
// the enforcers that share it: times all enfs, a region whose gateways send a key's
// traffic to one of its two enforcers (a gateway pinned to one, or hashing by key) was
// read at twice its rate on every report, as an arrival, and a key over its limit in two
// such regions swung between them at every round of acknowledgements
// (TestTrafficOnOneEnforcerIsNotAMove). Where none carried it before this report (traffic
// new to the region) it is all enfs, as before.
//
// Which way it errs: toward "not arrived". A key spread over every enforcer but missing
// from some of their reports for two windows (a small key under their usage tables'
// thresholds) is judged from fewer enforcers than carry it, so its arrival is found later;
// bits that collide (a region of many enforcers) are counted back by linear counting and
// are at most enfs. Once an arrival is found, how much arrived is read over all enfs (see
// usage). Called with c.mu held; bit != 0 (an enforcer's own report).
func (c *Core) spread(now time.Time, id *ident, r int, bit uint64, enfs int) int {
	w := now.UnixNano() / int64(c.cfg.Interval)
	if id.carried == nil {
		id.carried, id.carriedWin = make([]uint64, 2*c.n), w
	}
	switch d := w - id.carriedWin; {
	case d == 1:
		for i := 0; i < len(id.carried); i += 2 {
			id.carried[i+1], id.carried[i] = id.carried[i], 0
		}
		id.carriedWin = w
	case d > 1:
		clear(id.carried)
		id.carriedWin = w
	case d < 0: // a report stamped before the last (clocks differ): read, not recorded
		return enfs
	}
	seen := id.carried[2*r] | id.carried[2*r+1]
	id.carried[2*r] |= bit
	if seen == 0 {
		return enfs
	}
	return min(enfs, bitsCounted(seen|bit))
}

// bitsCounted is how many distinct enforcers set the bits of mask (each one bit of 64 by
// a hash): the linear-counting estimate −64·ln(1 − set/64), at least the bits set, and
// unbounded when all 64 are.
func bitsCounted(mask uint64) int {
	set := bits.OnesCount64(mask)
	if set >= 64 {
		return math.MaxInt
	}
	return max(set, int(math.Round(-64*math.Log1p(-float64(set)/64))))
}

// The region-level arrival test (arrivedTogether): how far apart the reports it sums may
// come, and the fewest tokens the smoothed demand must bring in their spans.
const (
	arrivalSpan      = 2 * time.Second
	arrivalMinTokens = 4
)

// arrivedTogether is the arrival test of shifted on the region's reports rather than one
// enforcer's: the counts of the recent spans of the reports that distinct enforcers of
// region r sent within arrivalSpan (this one included; bit is its enforcer's, 0 for an
// aggregator's merged report, which is tested alone), against the tokens the smoothed
// demand brings in those spans, by the same shiftSigmas and shiftTokens and one token
// more for each report past the first. Each enforcer sees about a third of a
// three-enforcer region's traffic, so one report holds a third of the evidence: a 50/s
// key whose 15/s in a region became 60/s was counted 13, 10 and 14 tokens by three
// reports within 0.7 s (many-keys, seed 32), each under its own threshold of about 15,
// together over the 31 their sum asks for, and it waited 2 s more for a report that
// passed alone.
//
// Distinct enforcers only (a report from one already summed starts the sum again from
// it): two reports of one enforcer 0.5 s apart count the same tokens twice, which a
// Poisson test does not allow for. bit is a hash of the enforcer's name, so two
// enforcers of a region may share one; that only ends a sum early. Nor a sum the
// smoothed demand brings fewer than arrivalMinTokens to: a small key's counts are not the
// Poisson counts the test assumes (a pair's recent span can start at its first request, a
// token high, and a report that carries a refusal was sent as a burst was refused), and
// over the 10,000-key population 678 of the 798 sums that passed in the steady state
// expected under two tokens: the versions per interval doubled. Such keys keep the
// one-report test. The extra token a report answers the same bias in larger keys.
//
// Which way it errs: a false arrival is a little likelier than with one report's test
// (about twice as many tests); it returns the mean of the summed reports' rates (the
// caller reads the region's rate as that × its enforcers), which a report from before the
// move pulls low (under).
// Called with c.mu held.
func (c *Core) arrivedTogether(now time.Time, id *ident, r int, bit uint64, rate, tokens float64, refused bool, enfs int) (float64, bool) {
	if bit == 0 || !(id.rate > 0) || !(rate > 0) || !(tokens > 0) || !count(rate) || !count(tokens) {
		return 0, false
	}
	if id.arr == nil {
		if !refused {
			return 0, false // nothing arrives where nothing is refused: no state for it
		}
		id.arr = make([]arrivalSum, c.n)
	}
	a := &id.arr[r]
	if a.mask&bit != 0 || now.Sub(a.from) > arrivalSpan {
		*a = arrivalSum{from: now}
	}
	sm := id.smoothedAt(r)
	n := float64(enfs)
	span := recentSpan(rate, tokens)
	a.got += rate * span
	a.mu += max(sm, 1) / n * span
	a.rate += rate
	a.k++
	a.mask |= bit
	if !refused {
		return 0, false
	}
	mean := a.rate / float64(a.k)
	if c.sumArrived(id, r, a.got, a.mu, mean, a.k, enfs) {
		*a = arrivalSum{}
		return mean, true
	}
	return 0, false
}

// arrivalSum is one identity's counts in one region for arrivedTogether.
type arrivalSum struct {
	got, mu float64 // tokens counted in the reports' recent spans; those the smoothed demand brings
	rate    float64 // Σ of the reports' recent rates
	k       int     // reports summed
	mask    uint64  // their enforcers' bits
	from    time.Time
}

// enforcerBit is the bit an enforcer's reports take in an arrivalSum: FNV-1a of its name,
// so a run's sums, like the rest of it, do not depend on the process.
func enforcerBit(id string) uint64 {
	h := fnv.New64a()
	io.WriteString(h, id) // a hash.Hash never fails a write
	return 1 << (h.Sum64() % 64)
}

// shifted says whether the recent rates of an identity in reports of region r (rate, the
// sum over `reports` reports — one, or an aggregator's merge of several — counting tokens
// in all; enfs enforcers in the region, spread of them carrying the key (Core.spread),
// which see about equal parts of its traffic) show
// its traffic moved. Such a report asks for a recompute at once (ShiftGap) whatever else
// it says — an acknowledgement of a decrease carries the region's new, lower rate — and
// that recompute reads the identity's demand from the recent rates (see recompute).
//
//   - Arrived: the region's rate, estimated as the mean rate × spread, is above its
//     smoothed demand and above its published share by more than the dead-band (traffic
//     arrived, and is refused), and the tokens counted are more than the smoothed demand
//     would bring in the span they were counted over by shiftSigmas standard deviations
//     of that Poisson count and shiftTokens more (under 1e-4 by chance at any rate; a
//     pair's first two requests in half a second never pass; at least one token is
//     taken as due, see countArrived). A swap of 60/s and 15/s of a 50/s key over three
//     enforcers moves 5/s to 20/s an enforcer: about 18 tokens where 4.5 were expected,
//     found in the first report after it (the old test, which asked for a doubled rate
//     and 10/s an enforcer beyond the noise, never found it: 6 to 15 s).
//     Or draining instead of refused: a key under its limit whose demand is established
//     (ident.established), reported by an enforcer that saw the region's bucket under
//     half its burst in the recent second (IdentityUsage.draining), is spending that
//     burst and is refused once it is spent; it moves on the first report that shows it
//     (a 100/s key's 48/12 swap into a region allowed 30/s spends half its burst 0.8 s
//     after it, and is refused from 1.7 s). The rate alone is not enough: over the
//     10,000-key population the test's rare false arrivals, read from every report of a
//     thousand keys of 10–100/s, took the versions a steady interval from 4.4 to 9.0.
//   - Without a count (an older enforcer), arrived: at least doubled, beyond 3 standard
//     deviations of the estimate (√(enfs × smoothed)) and 10 tokens a second an enforcer.
//   - Left: at most half the smoothed demand and below by more than a quarter dead-band,
//     beyond that noise and floor; read over all enfs (the carriers would read it lower).
func (c *Core) shifted(id *ident, r int, rate, tokens float64, refused, draining bool, reports, spread, enfs int) bool {
	return c.arrived(id, r, rate, tokens, refused, draining, reports, spread) || c.left(id, r, rate, tokens, reports, enfs)
}

// arrived is shifted's arrival test, the region's rate read as the mean rate × spread.
func (c *Core) arrived(id *ident, r int, rate, tokens float64, refused, draining bool, reports, enfs int) bool {
	if !(id.rate > 0) || !count(rate) || !count(tokens) || reports < 1 {
		return false
	}
	// Not recomputed yet (a key the balancer first hears of): its demand was nothing, and
	// traffic that arrived above its default share is a move like any other.
	sm := id.smoothedAt(r)
	n, k := float64(enfs), float64(reports)
	est := rate / k * n
	if tokens > 0 && rate > 0 {
		span := recentSpan(rate, tokens) // each report's; the count is the rate over it
		mu := max(sm, 1) / n * span * k  // the tokens the smoothed demand brings
		return (refused || draining && id.established()) && est > sm && countArrived(rate*span, mu, 0) && c.aboveShare(id, r, est)
	}
	noise := 3*math.Sqrt(n*max(sm, 1)) + 10*n
	return est >= 2*sm+noise && c.aboveShare(id, r, est) // judged by the rate alone
}

// left is shifted's test of traffic that left, the region's rate read as the mean rate ×
// enfs.
func (c *Core) left(id *ident, r int, rate, tokens float64, reports, enfs int) bool {
	if !(id.rate > 0) || !count(rate) || !count(tokens) || reports < 1 {
		return false
	}
	sm := id.smoothedAt(r)
	n := float64(enfs)
	est := rate / float64(reports) * n
	noise := 3*math.Sqrt(n*max(sm, 1)) + 10*n
	return est <= sm/2-noise && (sm-est)/id.rate >= c.cfg.Share.DeadBand/4
}

// established says whether id is under its limit with a demand the balancer has measured:
// its regions' smoothed demand sums to at least a quarter of its rate and less than all
// of it. Only then is a region's rate above its share read as an arrival before it is
// refused (shifted). Over its limit, a region at its share is the policy's cut, not a
// move; a key barely heard of has no split to move from, and its first second's counts
// are clumps (many-keys' key05, 15/s in ap-south, read at 40/s from 12 tokens in 0.6 s
// and held at 50/50 for 20 s when every key counted).
func (id *ident) established() bool {
	var sum float64
	for r := range id.st.Smoothed {
		sum += id.smoothedAt(r)
	}
	return sum >= id.rate/4 && sum < id.rate
}

// The arrival test's margin over the Poisson count the smoothed demand brings (shifted).
const (
	shiftSigmas = 4
	shiftTokens = 3
)

// countArrived is the arrival test on a count: got tokens counted where the smoothed
// demand brings mu, beyond shiftSigmas Poisson standard deviations, shiftTokens and
// extra; mu is taken as at least one token (eight counted, then): under one token due a
// count that starts at a request and is read because requests were refused is no Poisson
// count, and over 10,000 keys a rare key's clump of five requests in half a second passed
// every 10 s or so (docs/design.md §9). Which way it errs: a key of a few requests a
// second that really moves waits for the interval's recompute.
func countArrived(got, mu, extra float64) bool {
	mu = max(mu, 1)
	return got >= mu+shiftSigmas*math.Sqrt(mu)+shiftTokens+extra
}

// recentSpan is the span a recent rate was counted over (0.5–1 s at an enforcer), from
// the rate and its count: clamped, so a report claiming another span or a count its rate
// does not carry cannot move the arrival test past what an enforcer measures.
func recentSpan(rate, tokens float64) float64 { return min(max(tokens/rate, 0.5), 1) }

// aboveShare says whether est, a region's rate, is above its published share of id's
// limit by more than the dead-band: an arrival there is refused, and moves the shares.
func (c *Core) aboveShare(id *ident, r int, est float64) bool {
	return est/id.rate > id.published(c.n)[r]+c.cfg.Share.DeadBand
}

// regionBit is region r's bit in ident.moved; regions past 63 share the last one.
func regionBit(r int) uint64 { return 1 << min(r, 63) }

// mergeShifted is shifted for an aggregator's merge of several reports (reports > 1):
// the test the leader runs on several enforcers' reports together (arrivedTogether), not
// the one it runs on a report. A merge sums its reports' recent counts, and any report
// that refused the key or saw its region draining flags the whole; tested as one report,
// such sums passed where no report would have (a small key's few clumped requests at
// three enforcers, one of them refused), and through aggregators the 10,000-key
// population published four times as many versions an interval as directly (34 against
// 9). So the sum is an arrival only where a report refused the key (draining is one
// report's evidence, which the merge does not keep), the smoothed demand brings at least
// arrivalMinTokens in the reports' spans, and it passes the count test by a token more a
// report past the first; left reads the sum, as for any report. A forward of one report
// (an acknowledgement or an early report forwarded at once, most of a move's evidence) is
// that report, and shifted tests it as such.
//
// It returns the rate an enforcer sees (the merge's mean; the caller reads the region's
// as that × its enforcers). Which way it errs: toward "not arrived", so toward a move
// found later, never a share over: a report that would have passed alone may be diluted
// by the others in its merge (it waits for a report forwarded alone, or the interval's
// recompute); a merge's reports of one enforcer are summed as if of several; the reports
// counted are all the forward's, not only those that carry the key (both raise the
// tokens the sum must reach). Keeping the report that shows an arrival best alongside
// the sums (fields of IdentityUsage the leader tests alone) was tried: on the 10,000-key
// population it published 11.1 versions an interval instead of 8.3 (its rate is read
// over all the region's enforcers, where directly only those that carry the key count)
// and failed no fewer keys. Called with c.mu held.
func (c *Core) mergeShifted(id *ident, r int, u *allotv1.IdentityUsage, reports, enfs int) (float64, bool) {
	mean := u.RecentRate / float64(reports)
	return mean, c.arrivedSum(id, r, u.RecentRate, u.RecentTokens, u.Refused > 0, reports, enfs) || c.left(id, r, u.RecentRate, u.RecentTokens, reports, enfs)
}

// arrivedSum is arrivedTogether's test on the sum of several reports' recent counts that
// an aggregator's merge carries (mergeShifted): rate and tokens summed over reports.
func (c *Core) arrivedSum(id *ident, r int, rate, tokens float64, refused bool, reports, enfs int) bool {
	if !refused || !(id.rate > 0) || !(rate > 0) || !(tokens > 0) || !count(rate) || !count(tokens) {
		return false
	}
	span := recentSpan(rate, tokens)
	mu := max(id.smoothedAt(r), 1) / float64(enfs) * span * float64(reports) // the tokens the smoothed demand brings in their spans
	return c.sumArrived(id, r, rate*span, mu, rate/float64(reports), reports, enfs)
}

// sumArrived is the count test on k reports' recent counts summed (arrivedTogether,
// arrivedSum): got tokens counted where the smoothed demand brings mu, the region's rate
// read as the reports' mean rate × enfs. Only a sum of two reports or more, to which the
// smoothed demand brings arrivalMinTokens, with a token more of margin a report past the
// first.
func (c *Core) sumArrived(id *ident, r int, got, mu, mean float64, k, enfs int) bool {
	if k < 2 || mu < arrivalMinTokens {
		return false
	}
	est := mean * float64(enfs)
	return est > id.smoothedAt(r) && countArrived(got, mu, float64(k-1)) && c.aboveShare(id, r, est)
}
