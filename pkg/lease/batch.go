package lease

import (
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// leaseBatch decides whether a call for e's key (with these limits, for a check of the
// given cost) takes a lease, its size and how long its tokens may be spent: the busy batch
// (batchSize) for a busy key, under LeaseTTL, or the quiet batch (quietBatch) for a key far
// under its limits, under QuietTTL, whichever is larger; or, for the first check a key asks
// of this enforcer (firstAsk), the opening lot: the quiet batch of a key whose demand over
// QuietTTL is two checks (opening reports it; a partial grant of it does not mark the key
// contended). It records in e.quiet whether a quiet lease applies. Called with e's shard
// lock held.
func (s *Store) leaseBatch(e *entry, limits []bucket.Limit, cost int64, peers int, now int64) (batch, ttl int64, lease, opening bool) {
	b := int64(0)
	if e.busy(s.busyHits) {
		b = batchSize(limits, cost, e.demand(), peers, s.cfg.Window)
	}
	q := int64(0)
	crit, size, ok := e.slowDemand(now, s.quietTTL, s.ttl, cost)
	if !ok && b == 0 && e.firstAsk(now, s.quietTTL, cost) {
		crit, size, ok, opening = 2*cost, 2*cost, true, true
	}
	if ok {
		q = quietBatch(limits, cost, crit, size, peers, s.cfg.QuietTTL, s.cfg.LeaseTTL)
	}
	quiet := q > cost
	// An opening lot is not yet a quiet lease: the key's demand is a guess, and a refill
	// for it waits until slowDemand knows (spend).
	e.quiet, e.opening = quiet && !opening, quiet && opening
	if quiet && q >= b {
		return q, s.quietTTL, true, opening
	}
	return b, s.ttl, b > cost, false
}

// batchSize is the busy batch ("Batch size" in the package doc): the key's even part of
// one Window of the slowest rate over peers enforcers, at most twice its demand in a
// window when that is known, at least the check's cost, at most the smallest burst.
func batchSize(limits []bucket.Limit, cost, demand int64, peers int, window time.Duration) int64 {
	w := window.Seconds() / float64(max(peers, 1))
	byRate, burst := limits[0].Rate*w, limits[0].Burst
	for _, l := range limits[1:] {
		byRate, burst = min(byRate, l.Rate*w), min(burst, l.Burst)
	}
	b := int64(byRate) // rate ≤ 1e9 and window ≤ 1 min: no overflow; truncation is floor
	if demand > 0 {
		b = min(b, 2*demand)
	}
	b = max(b, cost)
	return min(b, int64(burst))
}

// quietBatch is the batch for a key this enforcer sees far under its limits, sized to the
// key's own demand over one QuietTTL (Q), as entry.slowDemand estimates it: crit (erring
// high) for the criterion, size (erring low) for the batch. With R the slowest rate of
// the limits, it is 0 (no quiet lease) unless
//
//	4 × N × crit ≤ R × Q        (the key runs at ≤ R/4 per fleet)
//
// and then size, capped at ⌊ R × T / (4 × N) ⌋ (T = LeaseTTL: what a quiet lease of one
// LeaseTTL could hold) and at the smallest burst. See "Quiet keys" in the package comment.
func quietBatch(limits []bucket.Limit, cost, crit, size int64, peers int, quiet, ttl time.Duration) int64 {
	if size <= cost {
		return 0
	}
	byRate, burst := limits[0].Rate, limits[0].Burst
	for _, l := range limits[1:] {
		byRate, burst = min(byRate, l.Rate), min(burst, l.Burst)
	}
	n := float64(4 * int64(max(peers, 1)))
	if n*float64(crit) > byRate*quiet.Seconds() {
		return 0
	}
	hold := int64(byRate * ttl.Seconds() / n) // ≤ 1e9 × 1 h: fits
	return max(min(size, hold, int64(burst)), 0)
}

// leasing reports whether a refill for e's key would take a lease (as leaseBatch would
// decide): the key is busy or quiet, or it spends its opening lot and its demand is now
// known (slowDemand). An opening lot spent by a key's second check within a LeaseTTL of
// its first is not refilled: the next check calls in the foreground, as it would have
// without the lot. Called with e's shard lock held.
func (s *Store) leasing(e *entry, now int64) bool {
	if e.busy(s.busyHits) || e.quiet {
		return true
	}
	if !e.opening {
		return false
	}
	_, _, ok := e.slowDemand(now, s.quietTTL, s.ttl, e.lastCost)
	return ok
}

// pace is how long an enforcer waits between calls for a key whose bucket it found
// drained — a lease call granted less than the batch it asked for, or refused:
//
//	pace = N × batch / (2 × rate)     (rate: the slowest of the request's limits)
//
// While a key is contended every call takes everything the bucket has gathered since the
// fleet's previous call; N enforcers each calling once per pace call the bucket every
// pace / N on average, so a call collects about rate × pace / N = batch/2 tokens and costs
// 2/batch calls per admitted check, instead of one call per few tokens. With the usual
// batch = rate × Window / N the pace is Window/2. The bucket fills in burst/rate >= batch/rate,
// longer than the fleet's interval (batch/(2 × rate)), so tokens wait in the bucket for the
// next call rather than overflow: pacing errs under only by what is still in the bucket or
// held. Checks that find the lease empty while paced are refused from memory
// (Source = refusal-cache, RetryAfter = the time left). Capped at Window.
//
// When the pace is over and the lease is empty, and pacing refused a check meanwhile (the
// key is still offered more than it gets), the next call goes in the background
// (Store.refillsContended): the check that finds it so, and those arriving while the call
// is in flight, are refused from memory too (RetryAfter = refillWait), so no check for a
// key offered over its limit waits on the store. This errs under by those few checks,
// which the bucket might have granted: the tokens are not lost, the call collects them for
// the checks after it. A client that waited out its Retry-After, with no check refused by
// pacing since, is not refused so: its check calls in the foreground as any other. Once a
// call is granted all it asked for, the key is no longer contended; a refill that cannot
// be queued ends the contention too, so the next check calls in the foreground (and sees
// a failing store's error).
func pace(limits []bucket.Limit, batch int64, peers int, window time.Duration) int64 {
	r := limits[0].Rate
	for _, l := range limits[1:] {
		r = min(r, l.Rate)
	}
	p := float64(max(peers, 1)) * float64(batch) / (2 * r) * 1e9
	return int64(min(p, float64(window)))
}
