package lease

import (
	"math"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// entry is what the table knows about one identity. Every field is guarded by the mutex of
// the shard the entry lives in. Times are nanoseconds since Store.base.
type entry struct {
	key        string
	prev, next *entry // the shard's LRU ring; most recently used right after the sentinel
	tick       uint64 // the shard's tick when e last went to the front of the ring

	// limits are the limits the lease, the refusal cache and the bucket view were taken
	// under. Replaced (never written in place) when a request brings other limits, so a
	// call in flight may keep using the old slice; gen counts the replacements.
	limits []bucket.Limit
	// lim0 is limits[0] (the zero Limit while limits is empty), kept in the entry: a check
	// compares its limits with the entry's on every take, and the slice is the entry's own
	// (each key's share gives it other limits), a cache miss of its own in a large table.
	lim0 bucket.Limit
	gen  uint32
	gone bool // evicted: a call landing here keeps nothing

	// The lease: two lots of tokens, each expiring LeaseTTL (QuietTTL for a quiet batch)
	// after the call that took it was sent. cur is spent first; nxt moves up when cur is empty. Lots never merge into
	// a later expiry: see add.
	cur, nxt       int64
	curExp, nxtExp int64

	batch    int64 // lease size of the last lease call; refill when held <= batch/2
	quiet    bool  // the quiet criterion held at the last call (see quietBatch)
	opening  bool  // the last call asked for the key's opening lot (see Store.leaseBatch)
	lapsed   bool  // leased tokens expired unspent since the last call (for callReason)
	lastCost int64 // Min of the last check spent from the lease: a refill's Min

	// Busyness and demand: checks and tokens asked in the current window and the last.
	winStart       int64
	hits, prevHits int64
	asked, prevAsk int64
	// Slow demand: tokens asked in the current QuietTTL-long period and the last (see
	// quietBatch).
	slowStart         int64
	slowAsk, slowPrev int64
	refillAfter       int64 // no background refill before this (back-off after a failure)
	pacedUntil        int64 // contended: no call for this key before this (see pace)
	contended         bool  // the last lease call was granted less than it asked (see pace)
	pacedRefused      bool  // a check was refused by pacing since the last lease call
	refusedUntil      int64 // refusal cache: the next store cannot give refusedMin tokens
	refusedMin        int64 // before refusedUntil
	limiting          int   // the bucket view from the last answer of the next store
	remaining         int64
	resetAt           int64
	flight            *flight // the one call to the next store in flight for this key, if any
	// Sightings (Config.ID): when this enforcer last sighted the key, and the count of the
	// enforcers that serve it from the store's last reply that carried one, at seenAt.
	sightAt, seenAt int64
	sightFrom       int64 // the first sighting of the current run (none SightTTL long before it)
	seen            int
	sighted         bool // sightAt is set
	// Penalty (bucket.Request.Penalty): the rule's penalty the last request carried (nil
	// without one), the refusals answered from memory since the last call that handed
	// them over (counted only with a penalty, and not while blocked), and when the store
	// last said the key is blocked until.
	penalty      *bucket.Penalty
	unpaid       int64
	penaltyUntil int64
}

// countRefusal counts a refusal answered from memory at now toward the key's penalty:
// only with a penalty and not while the key is blocked by it. Called with e's shard lock
// held.
func (e *entry) countRefusal(now int64) {
	if e.penalty != nil && now >= e.penaltyUntil && e.unpaid < bucket.MaxPenaltyRefusals {
		e.unpaid++
	}
}

// handOver moves the refusals counted from memory into req, which a call is about to
// send (none without a penalty). The caller gives them back (e.unpaid += req.Refused)
// if the call fails.
func (e *entry) handOver(req *bucket.Request) {
	if req.Penalty != nil && e.unpaid > 0 {
		req.Refused, e.unpaid = e.unpaid, 0
	}
}

// flight is one call to the next store; checks that miss while it is in flight wait for it
// instead of calling too (single flight).
//
// A flight is one allocation at most: the request a foreground call sends lives in it (a
// request of its own would escape to the heap through the next store's Take), and done is
// made only for a check that waits (wait), which is rare: most calls land unwaited for,
// and such a flight is the shard's spare, which its next call reuses (Store.call).
type flight struct {
	req  bucket.Request // the request a foreground call sends (begin)
	done chan struct{}  // closed when the call has landed, if a check waits for it
	bg   bool           // a background refill: its error is told to nobody
	err  error          // the call's error, set before done is closed
	// shared: waiters return err too (the store failed, not the leader's context).
	shared bool
}

// wait returns a channel closed when f lands. Called with the key's shard lock held, while
// f is the entry's flight (it has not landed).
func (f *flight) wait() <-chan struct{} {
	if f.done == nil {
		f.done = make(chan struct{})
	}
	return f.done
}

// landed wakes the checks waiting for f. Called with the key's shard lock held, once.
func (f *flight) landed() {
	if f.done != nil {
		close(f.done)
	}
}

// count records one check of cost tokens at now in the busyness window.
func (e *entry) count(now, window, cost int64) {
	if d := now - e.winStart; d >= window {
		if d < 2*window {
			e.prevHits, e.prevAsk = e.hits, e.asked
		} else {
			e.prevHits, e.prevAsk = 0, 0
		}
		e.winStart, e.hits, e.asked = now, 0, 0
	}
	e.hits++
	e.asked += cost
}

// countSlow records cost tokens at now in the QuietTTL-long demand period (ttl).
func (e *entry) countSlow(now, ttl, cost int64) {
	if d := now - e.slowStart; d >= ttl {
		if d < 2*ttl {
			e.slowPrev = e.slowAsk
		} else {
			e.slowPrev = 0
		}
		e.slowStart, e.slowAsk = now, 0
	}
	e.slowAsk += cost
}

// slowDemand is what this enforcer knows at now of the key's demand over one period
// (QuietTTL), for quietBatch; ok is false while it knows too little to lease for:
//
//   - crit, for the criterion, errs high: the last whole period's demand, or the current
//     part's pace (tokens over the time it has run, at least one ttl, LeaseTTL) times the
//     period, whichever is more;
//   - size, for the batch, errs low: the last whole period's demand, or the current part
//     scaled to a period as if it had run one ttl longer, whichever is more;
//   - ok once the last whole period asked at least 2 × cost, or the current part has run
//     at least one ttl and asked that much. A key seen for the first time is leased
//     its demand after a second or so rather than a whole period; what it is leased on
//     its first check is the opening lot (Store.leaseBatch, firstAsk), not this.
func (e *entry) slowDemand(now, period, ttl, cost int64) (crit, size int64, ok bool) {
	prev, ask, start := e.slowAt(now, period)
	elapsed := max(now-start, 0)
	p := float64(period)
	crit = max(prev, int64(float64(ask)*p/float64(max(elapsed, ttl))))
	size = max(prev, int64(float64(ask)*p/float64(elapsed+ttl)))
	ok = prev >= 2*cost || (elapsed >= ttl && ask >= 2*cost)
	return crit, size, ok
}

// callReason is why a check of the key waits on a foreground call that leases or not
// (lease), as the Observer is told (EventCallNew and the three after it).
func (e *entry) callReason(lease bool) Event {
	switch {
	case e.resetAt == 0:
		return EventCallNew
	case e.lapsed:
		return EventCallExpired
	case lease && e.batch > 0:
		return EventCallSpent
	}
	return EventCallExact
}

// slowAt is the slow-demand period's figures as of now (the last whole period's tokens,
// the current one's and when it started), rolled as countSlow would roll them.
func (e *entry) slowAt(now, period int64) (prev, ask, start int64) {
	prev, ask, start = e.slowPrev, e.slowAsk, e.slowStart
	if d := now - start; d >= period {
		if d < 2*period {
			prev = ask
		} else {
			prev = 0
		}
		ask, start = 0, now
	}
	return prev, ask, start
}

// firstAsk reports whether the check in hand, of cost tokens and already counted, is all
// the key has asked of this enforcer over the current slow-demand period and the last
// one: the key is new here, or back after two quiet periods (see "Quiet keys").
func (e *entry) firstAsk(now, period, cost int64) bool {
	prev, ask, _ := e.slowAt(now, period)
	return prev == 0 && ask <= cost
}

// busy: at least minHits checks in the current window or in the one before it.
func (e *entry) busy(minHits int64) bool { return e.hits >= minHits || e.prevHits >= minHits }

// demand is the tokens asked in the current window or the last whole one, whichever is more.
func (e *entry) demand() int64 { return max(e.asked, e.prevAsk) }

// expire drops lots whose time is up and moves nxt up into an empty cur. It returns the
// tokens dropped.
func (e *entry) expire(now int64) (dropped int64) {
	if e.cur > 0 && now >= e.curExp {
		dropped += e.cur
		e.cur = 0
	}
	if e.nxt > 0 && now >= e.nxtExp {
		dropped += e.nxt
		e.nxt = 0
	}
	if e.cur == 0 && e.nxt > 0 {
		e.cur, e.curExp, e.nxt = e.nxt, e.nxtExp, 0
	}
	return dropped
}

func (e *entry) held() int64 { return e.cur + e.nxt }

// refusalFromMemory is the answer of a check refused without calling the next store, until
// the given time (the refusal cache's or the pacing's), with the budget last seen.
func (e *entry) refusalFromMemory(until, now int64) bucket.Result {
	if now < e.penaltyUntil && until <= e.penaltyUntil {
		return bucket.Result{RetryAfter: time.Duration(until - now), Reset: time.Duration(until - now), Source: bucket.SourceRefusalCache, Penalized: true}
	}
	return bucket.Result{
		Limiting:   e.limiting,
		Remaining:  e.remaining,
		RetryAfter: time.Duration(until - now),
		Reset:      time.Duration(max(e.resetAt-now, 0)),
		Source:     bucket.SourceRefusalCache,
	}
}

// spend takes n <= held() tokens, oldest lot first.
func (e *entry) spend(n int64) {
	if n <= e.cur {
		e.cur -= n
	} else {
		e.nxt -= n - e.cur
		e.cur = 0
	}
	if e.cur == 0 && e.nxt > 0 {
		e.cur, e.curExp, e.nxt = e.nxt, e.nxtExp, 0
	}
}

// add puts g newly taken tokens into the lease, expiring at exp. If both lots are in use,
// the two older lots merge under the earlier expiry: a token may die earlier than its own
// TTL (errs under), never later.
func (e *entry) add(g, exp int64) {
	if g <= 0 {
		return
	}
	e.lapsed = false
	switch {
	case e.cur == 0:
		e.cur, e.curExp = g, exp
	case e.nxt == 0:
		e.nxt, e.nxtExp = g, exp
	default:
		e.cur += e.nxt
		e.curExp = min(e.curExp, e.nxtExp)
		e.nxt, e.nxtExp = g, exp
	}
}

// dropLease forgets everything taken under the current limits and returns the tokens held.
func (e *entry) dropLease() int64 {
	d := e.cur + e.nxt
	e.cur, e.nxt = 0, 0
	e.refusedUntil, e.refusedMin = 0, 0
	e.remaining, e.resetAt, e.limiting = 0, 0, 0
	e.refillAfter, e.pacedUntil, e.contended, e.pacedRefused = 0, 0, false, false
	return d
}

// setLimits replaces the entry's limits with ls (a slice no one writes: see
// shard.internLimits), dropping the lease and the refusal cache taken under the old ones.
// It returns the tokens dropped.
func (e *entry) setLimits(ls []bucket.Limit) int64 {
	d := e.dropLease()
	e.limits = ls
	e.lim0 = bucket.Limit{}
	if len(ls) > 0 {
		e.lim0 = ls[0]
	}
	e.gen++
	return d
}

// sameLimits says whether e's limits are ls, reading e.limits only past the first.
func (e *entry) sameLimits(ls []bucket.Limit) bool {
	if len(e.limits) != len(ls) {
		return false
	}
	if len(ls) == 0 {
		return true
	}
	if l := &ls[0]; l.Rate != e.lim0.Rate || l.Burst != e.lim0.Burst || l.Name != e.lim0.Name {
		return false
	}
	return len(ls) == 1 || sameLimits(e.limits[1:], ls[1:])
}

func sameLimits(a, b []bucket.Limit) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Rate != b[i].Rate || a[i].Burst != b[i].Burst || a[i].Name != b[i].Name {
			return false
		}
	}
	return true
}

// observe records what the next store said at start (when the call was sent) about a call
// asking req: the bucket view for later Results and, if it refused, the refusal cache.
//
// The refusal cache is also primed after a grant that left the limiting bucket with fewer
// whole tokens than some m = Remaining+1: the bucket then cannot hold m tokens for
//
//	wait(m) = (m − f)/rate,  f = the fractional tokens left,
//
// and since Reset ≈ (burst − f)/rate, wait(m) = Reset − (burst − m)/rate. Reset may be
// rounded up (to µs by bucket.Memory, possibly to ms by another store), so the cache uses
// Reset − 1ms − (burst − m)/rate, rounded down: it refuses only while the bucket provably
// cannot give m tokens (other enforcers only take more), so it errs toward calling, never
// toward refusing what the store would grant. This turns a retry storm's "granted 1, then
// refused" pairs into one call per retry interval.
func (e *entry) observe(req *bucket.Request, res bucket.Result, start int64) {
	e.limiting, e.remaining = res.Limiting, res.Remaining
	e.resetAt = start + int64(res.Reset)
	if res.Penalized {
		// Blocked by the rule's penalty: refused from memory until its end, and tokens
		// still leased are dropped (the caller counts them as limits-changed), so the key
		// gets nothing here until then.
		e.penaltyUntil = start + int64(res.RetryAfter)
		e.refusedUntil, e.refusedMin = e.penaltyUntil, 1
		return
	}
	if res.Granted == 0 {
		if res.RetryAfter > 0 {
			e.refusedUntil, e.refusedMin = start+int64(res.RetryAfter), req.MinGrant()
		}
		return
	}
	if res.Limiting < 0 || res.Limiting >= len(req.Limits) || res.Reset <= 0 {
		return
	}
	l := req.Limits[res.Limiting]
	m := res.Remaining + 1
	if float64(m) > l.Burst {
		return
	}
	wait := int64(res.Reset) - int64(time.Millisecond) - int64(math.Ceil((l.Burst-float64(m))/l.Rate*1e9))
	if wait > 0 {
		e.refusedUntil, e.refusedMin = start+wait, m
	}
}

// setContended records whether a lease call sent at start asking want tokens under limits
// got less (contended) and, if so, paces the key.
func (e *entry) setContended(contended bool, start int64, limits []bucket.Limit, want int64, peers int, window time.Duration) {
	e.contended, e.pacedRefused = contended, false
	if contended {
		e.pacedUntil = start + pace(limits, want, peers, window)
	}
}

// refused reports whether the refusal cache answers a check needing min tokens at now.
func (e *entry) refused(now, min int64) bool {
	return now < e.refusedUntil && min >= e.refusedMin && e.refusedMin > 0
}
