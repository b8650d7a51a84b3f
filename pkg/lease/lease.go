// Package lease is the layer that keeps busy keys off Redis: a bucket.Store decorator that
// takes tokens from the next store in batches, spends them from memory, and remembers
// refusals until the next store said to retry.
//
// # Guarantees
//
// Never over: every token this layer grants was taken from the next store first, under the
// same limits, less than LeaseTTL earlier (QuietTTL for a quiet lease), but for the one
// check per lapse that the lapsed check (below) answers from a lot that has just expired,
// within the tokens held. From any start the
// fleet of enforcers therefore admits no more than the bucket gave; within one window it
// may admit, on top of what the bucket gives in that window, the tokens the fleet held
// when it began (bounded below: "Quiet keys"). It errs under, in these bounded ways:
//
//   - Tokens leased but not spent (at most about 1.5 batches per key per enforcer) are
//     stranded until they expire or are dropped (limits changed, key evicted).
//   - A lowered limit bites at the key's next check: a lease taken under other limits is
//     dropped then (tokens it held count as limits-changed).
//   - A refused key is refused from memory until the retry time the next store gave,
//     counted from when the call was sent, so the cache expires at or before the store's
//     own retry time (as the store rounded it: up, to the µs). The cache is also primed
//     when a grant leaves the bucket empty (see entry.observe): only while the bucket
//     provably cannot give the tokens. Neither refuses what the store would grant (barring
//     a store that loses its state, e.g. a Redis failover).
//   - A contended key — a lease call got less than the batch it asked for — is paced: no
//     call before about Window/2 (see pace), and checks that find the lease empty until
//     then are refused from memory although the bucket may have gathered a few tokens.
//     Those tokens wait in the bucket for the next call; they are lost only if the bucket
//     fills meanwhile (a burst under ~100 ms of the rate). This is what keeps a key offered
//     at or above its limit at a few calls per hundred admitted checks instead of one call
//     per token or two. While checks keep being refused so, the call after the pace goes
//     in the background and the checks in its round trip are refused from memory too, so
//     no check for such a key waits on the next store (see pace).
//
// # Batch size
//
// An enforcer is one of N in its region (Config.Peers) and the limits it is given are the
// region's. Over a window W (Config.Window, 100 ms) the region may admit rate × W tokens of
// a limit, and this enforcer's even part is rate × W / N. For a request of cost c:
//
//	byRate = ⌊ min over the request's limits of rate × W / N ⌋
//	batch  = min(byRate, 2 × d)           d: tokens this enforcer was asked for the key in
//	                                        the current window or the last one (whichever
//	                                        is more), so a lease never covers more than
//	                                        about two windows of the key's local demand
//	batch  = max(batch, c)                 a batch always serves the check in hand
//	batch  = min(batch, ⌊ min burst ⌋)     and never exceeds what a bucket can hold
//
// A key is leased with this batch when it is busy — this enforcer saw at least
// Config.BusyHits checks for it within one window (or a check arrived while a call for it
// was in flight) — and batch > c; or with the quiet batch below (the larger of the two
// when both apply); or, on its first check, with the opening lot below. Otherwise every
// check is the exact per-request call: a key with few checks and no whole lease TTL of
// history, or near its limit, costs one call per check and gets exact answers. The busy
// criterion errs toward exactness: a key just under the threshold pays one call per check
// rather than stranding a batch it would not spend.
//
// # Quiet keys
//
// A key seen less than BusyHits times a window would cost one call per check, and most
// keys of a real population are such keys (a Zipf tail seen a few times a second or
// less). A key far below its limits instead leases a batch sized to its own demand over
// one QuietTTL (Q, Config.QuietTTL, 2 min), whose tokens may be spent for Q:
//
//	prev  = tokens this enforcer was asked for the key over the last whole Q
//	a, t  = tokens asked so far in the current Q, and for how long it has run
//	crit  = max(prev, a × Q / max(t, T))          the demand over Q, erring high
//	size  = max(prev, a × Q / (t + T))            the demand over Q, erring low
//	quiet batch = min(size, ⌊ R × T / (4 × N) ⌋, ⌊ min burst ⌋)
//	              when 4 × N × crit ≤ R × Q, and prev ≥ 2c or (t ≥ T and a ≥ 2c)
//
// with R the slowest rate of the request's limits, T = LeaseTTL and N the enforcers in
// the region. A key needs at least a LeaseTTL of history with two checks for it, so one
// seen for the first time is leased its demand a second or two later, its batch growing
// toward its demand over Q as the period fills. It is refilled at half, like a busy
// lease, so in steady state it costs one call per batch: one per Q for a key under the
// cap, instead of one per check. A quiet key seldom spends half its batch, so its lot
// usually expires first; the key's next check is then the lapsed check below, and the
// refill it makes due goes in the background.
//
// The opening lot. A key's first check here (nothing asked of this enforcer for it over
// the current Q and the one before) is the quiet batch of a key whose demand over Q is
// two checks: crit = size = 2c, so Want = 2c (Min = c) when 2c fits the cap above, under
// QuietTTL. Its second check is then spent from memory; if that check comes a LeaseTTL or
// more after the first, the key's demand is known and the lot is refilled in the
// background with its quiet batch, so a key of the tail waits on the store once, not on
// its first two checks. A second check within a
// LeaseTTL does not refill it (the demand is still a guess: the next check calls, as it
// did without the lot), and a lot granted only in part does not pace the key. It errs
// like a quiet lease, within its bounds: each enforcer strands at most c tokens of a key
// it saw once, for at most Q, and a key's first window may admit c more per enforcer. It
// costs no call: the first check called anyway.
//
// The lapsed check. A lot expires unspent when its key does not come back within the
// lot's life: a quiet key seen every minute or two, a client polling on a timer, a busy key
// that paused. The check that finds its key's lease so would wait on a call to the next
// store. Instead it spends its own cost (Request.MinGrant) from the lot that has just
// expired; the rest of the lot is dropped as expired, and the refill that an empty lease
// makes due goes in the background (when the key is still worth a lease), so the key's
// next checks are answered from that. A key that comes back, at any period, then waits on
// the store only when it is new here or its demand no longer earns a lease. It applies only
// when the key holds nothing else and was last seen neither refused (the refusal cache),
// paced nor contended: a key at or over its limit gets no token taken long ago. A change
// of limits drops the lease before it is looked at (refresh), so none is spent under other
// limits. See keepLapsed.
//
// Which way it errs, and by how much. Under, never over in total: tokens are still taken
// before they are spent. The criterion keeps the fleet's demand for the key at or under
// R/4 (measured over Q). Each enforcer holds at most about 1.5 quiet batches, so the fleet
// holds at most 1.5 × N × R × T/(4N) = 0.375 × R × T tokens of the key (375 tokens for a
// 1,000/s limit): the cap is what a quiet lease of one LeaseTTL could hold, so the longer
// life changes how long those tokens can stay stranded (up to Q), not how many.
//   - Under: a key whose traffic moves to other enforcers, or jumps from under R/4 to
//     its limit, finds its bucket short by at most the tokens the fleet holds
//     (≤ 0.375 × R × T), until they are spent or expire (≤ Q). At steady demand they
//     cannot cause a refusal: the bucket is drawn at most 2.5 × R/4 < R.
//   - Over, in a window only: tokens taken before a window and spent in it are admitted
//     in the window on top of what the bucket gives then, so a key jumping from quiet
//     to far over its limit may see, in its first window, up to the tokens held
//     (≤ 0.375 × R × T) above burst + rate × window; never over across the key's life.
//     A busy lease has the same property with its smaller batch (the fleet holds at most
//     1.5 × R × Window of a busy key: 150 tokens for 1,000/s).
//   - The lapsed check: its token was taken before it is spent, but it is spent after its
//     lot's TTL, by as long as the key was away. It is one of the tokens that enforcer held
//     (what expired), so the window bound above holds as it is: a key back from a pause
//     to far over its limit may see, in its first window, one check more per enforcer
//     than the bucket alone gives then, once per lapse, and only if that enforcer last saw
//     the key uncontended. No more tokens are held for it: the token is spent instead
//     of dropped.
//
// As a key's measured demand grows past R/(4N) per enforcer the quiet batch is withdrawn
// and the busy batch (a 1/N share of one Window of R, and at most two windows of local
// demand, under LeaseTTL) applies, which is small near the limit. A limit changed by a rule
// or a share drops the lease at the key's next check, whatever its TTL.
//
// The lease is refilled in the background when it falls to half a batch or less (and the
// key is not paced or refused), so a busy key does not wait on the next store. Calls ask
// Want = batch, Min = c: a partial grant still serves. At most one call per key is in
// flight; checks that miss meanwhile wait for it and share its answer (or its error).
//
// Measured against a real 3-master Redis Cluster (integration_test.go): one key limited to
// 1,000/s offered at or above its limit through 3 enforcers costs 0.03–0.06 Redis calls
// per admitted check; a retry storm at 100× the limit costs at most about one call per
// retry interval per enforcer.
//
// # Where answers come from
//
// Result.Source is bucket.SourceLease for checks spent from leased tokens,
// bucket.SourceRefusalCache for refusals from memory, and the next store's own Source for
// checks that called it.
package lease

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// Store is a bucket.Store that leases tokens for busy keys from the next store and caches
// refusals; see the package documentation for its guarantees. It is safe for concurrent
// use. The zero value is not usable: call New. Close stops its background refills.
type Store struct {
	// mu guards shutting, so no refill is queued after Close has drained the queue. The
	// table has its own locks, one per shard (table.go).
	mu       sync.RWMutex
	shutting bool

	next      bucket.Store
	take      func(context.Context, *bucket.Request) (bucket.Result, error) // next's TakeValid (or Take)
	cfg       Config
	base      time.Time // times in entries are nanoseconds since base (monotonic if the clock has it)
	ttl       int64
	quietTTL  int64
	window    int64
	busyHits  int64
	seed      maphash.Seed
	mask      uint64
	perShard  int
	moveAfter uint64 // a hit moves its entry to the front after this many others went (table.go)
	shards    []shard

	work   chan *entry // background refills waiting for a refiller
	stop   chan struct{}
	ctx    context.Context // cancelled by Close: in-flight refills give up
	cancel context.CancelFunc
	wg     sync.WaitGroup // the refillers
	bg     sync.WaitGroup // queued and in-flight refills (tests wait on it)
	closed atomic.Bool

	closeOnce sync.Once
	hooks     hooks
}

// hooks let tests in this package see a background refill land and a check start waiting
// for another's call, without sleeping. Nil in production.
type hooks struct {
	landed  func()
	waiting func()
}

// New returns a Store over next. It starts cfg.Refillers goroutines; Close stops them.
func New(next bucket.Store, cfg Config) (*Store, error) { return newStore(next, cfg, hooks{}) }

func newStore(next bucket.Store, cfg Config, h hooks) (*Store, error) {
	if next == nil {
		return nil, fmt.Errorf("%w: next store is nil", ErrConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n := shardsFor(cfg.MaxKeys)
	s := &Store{
		next:      next,
		take:      bucket.Validated(next),
		cfg:       cfg,
		base:      cfg.Clock.Now(),
		ttl:       int64(cfg.LeaseTTL),
		quietTTL:  int64(cfg.QuietTTL),
		window:    int64(cfg.Window),
		busyHits:  int64(cfg.BusyHits),
		seed:      maphash.MakeSeed(),
		mask:      uint64(n - 1),
		perShard:  cfg.MaxKeys / n,
		moveAfter: uint64(max(1, cfg.MaxKeys/n/4)),
		shards:    make([]shard, n),
		work:      make(chan *entry, cfg.RefillQueue),
		stop:      make(chan struct{}),
		hooks:     h,
	}
	for i := range s.shards {
		s.shards[i].init()
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	refillers := cfg.Refillers
	if cfg.SyncRefill {
		refillers = 0
	}
	for range refillers {
		s.wg.Add(1)
		go s.refiller()
	}
	return s, nil
}

func (s *Store) now() int64 { return int64(s.cfg.Clock.Now().Sub(s.base)) }

func (s *Store) emit(ev Event, n int64) {
	if s.cfg.Observer != nil {
		s.cfg.Observer(ev, n)
	}
}

func (s *Store) peers() int {
	if s.cfg.Peers == nil {
		return 1
	}
	return max(s.cfg.Peers(), 1)
}

// Take implements bucket.Store. A check is answered from leased tokens when the key holds
// at least req.MinGrant() of them, from the refusal cache while the next store said it
// cannot give that many, and otherwise by one call to the next store shared by every check
// of the key that misses meanwhile. Errors from the next store are returned as they are.
//
// A lease answer's Remaining is an estimate — what the bucket had left at the last call
// plus what this enforcer still holds — and its Reset and Limiting are the last call's,
// aged; a refusal from memory carries RetryAfter = the time left until this enforcer will
// ask again. The fast path (answered from the lease) reads the clock once, takes one
// shard lock and allocates nothing.
func (s *Store) Take(ctx context.Context, req *bucket.Request) (bucket.Result, error) {
	if err := req.Validate(); err != nil {
		return bucket.Result{}, err
	}
	return s.TakeValid(ctx, req)
}

// TakeValid is Take of a request the caller has validated (bucket.ValidTaker); the calls
// it makes for req (its batch is capped by the smallest burst, so they are valid too) go
// to the next store's TakeValid.
func (s *Store) TakeValid(ctx context.Context, req *bucket.Request) (bucket.Result, error) {
	sh := s.shardOf(req.Identity)
	now := s.now()
	counted := false
	for {
		if s.closed.Load() {
			return bucket.Result{}, ErrClosed
		}
		sh.mu.Lock()
		e := s.lookup(sh, req.Identity, now)
		s.refresh(sh, e, req, now)
		if !counted {
			e.count(now, s.window, req.Want)
			e.countSlow(now, s.quietTTL, req.Want)
			counted = true
		}
		if res, ok, refill := s.fromMemory(e, req, now); ok {
			sh.mu.Unlock()
			if refill { // Config.SyncRefill
				s.refill(e)
			}
			return res, nil
		}
		f := e.flight
		var c callFor
		if f == nil {
			c = s.begin(e, req, now)
		} else {
			// Someone is calling for this key: it is busy; wait for that call and look again.
			e.hits = max(e.hits, s.busyHits)
		}
		sh.mu.Unlock()
		if f == nil {
			return s.call(ctx, sh, e, req, c, now)
		}
		if s.hooks.waiting != nil {
			s.hooks.waiting()
		}
		select {
		case <-f.done:
		case <-ctx.Done():
			return bucket.Result{}, ctx.Err()
		}
		if f.shared {
			return bucket.Result{}, f.err
		}
		now = s.now()
	}
}

// TakeCached answers req from memory — leased tokens, the refusal cache, pacing — when it
// can, and reports whether it did (pkg/fallback's Cache). When it reports false the check
// has not been counted toward the key's demand, so the caller passes it to Take. It never
// blocks on a call and allocates nothing, and it calls the next store only with
// Config.SyncRefill, for a refill the check made due. req must be valid
// (Request.Validate): pkg/fallback validates once before it asks; TakeCached checks only
// that the number of limits fits the entry (one comparison), so that an unvalidated
// request cannot write past it.
func (s *Store) TakeCached(req *bucket.Request) (bucket.Result, bool) {
	if s.closed.Load() || len(req.Limits) == 0 || len(req.Limits) > bucket.MaxLimits {
		return bucket.Result{}, false
	}
	sh := s.shardOf(req.Identity)
	now := s.now()
	sh.mu.Lock()
	e := s.lookup(sh, req.Identity, now)
	s.refresh(sh, e, req, now)
	if !s.inMemory(e, req, now) {
		sh.mu.Unlock()
		return bucket.Result{}, false
	}
	e.count(now, s.window, req.Want)
	e.countSlow(now, s.quietTTL, req.Want)
	res, ok, refill := s.fromMemory(e, req, now)
	sh.mu.Unlock()
	if refill { // Config.SyncRefill
		s.refill(e)
	}
	return res, ok
}

// refresh brings e up to date for req at now: new limits drop the lease, expired tokens go.
// Called with sh.mu held, sh being e's shard.
func (s *Store) refresh(sh *shard, e *entry, req *bucket.Request, now int64) {
	if !sameLimits(e.limits, req.Limits) {
		if d := e.setLimits(sh.internLimits(req.Limits)); d > 0 {
			s.emit(EventLimitsChanged, d)
		}
	}
	if d := e.expire(now); d > 0 {
		e.lapsed = true
		if d -= keepLapsed(e, req, now, d); d > 0 {
			s.emit(EventExpired, d)
		}
	}
}

// keepLapsed keeps, of the d tokens of e's lease that just expired unspent, the cost of
// the check in hand, for it alone to spend: the lapsed check (see the package comment). It
// does so only when the key holds nothing else and was last seen neither refused, paced
// nor contended, and returns the tokens kept. Called with e's shard lock held.
func keepLapsed(e *entry, req *bucket.Request, now, d int64) int64 {
	m := req.MinGrant()
	if d < m || e.held() > 0 || e.contended || now < e.pacedUntil || e.refused(now, m) {
		return 0
	}
	// A lot that expires at the next instant: this check spends it under the same lock,
	// and if it does not (it always does today), the next lookup drops it as expired.
	e.cur, e.curExp = m, now+1
	return m
}

// inMemory reports whether fromMemory would answer req. Called with e's shard lock held.
func (s *Store) inMemory(e *entry, req *bucket.Request, now int64) bool {
	min := req.MinGrant()
	return e.held() >= min || e.refused(now, min) || now < e.pacedUntil || s.refillsContended(e, now)
}

// refillsContended reports whether a check for a contended key, refused by pacing since
// its last call, that finds its lease empty and its pace over is answered from memory while
// a background refill is in flight, rather than waiting on a call (see pace): true if such
// a refill is in flight, or none is and one may be queued (no back-off after a failure).
// Called with e's shard lock held.
func (s *Store) refillsContended(e *entry, now int64) bool {
	if !e.contended || !e.pacedRefused {
		return false
	}
	if e.flight != nil {
		return e.flight.bg
	}
	return now >= e.refillAfter
}

// fromMemory answers a counted check from the lease, the refusal cache or pacing, if one
// applies (ok). refill asks the caller to run s.refill(e) once it has released the lock
// (Config.SyncRefill; see spend). Called with e's shard lock held.
func (s *Store) fromMemory(e *entry, req *bucket.Request, now int64) (res bucket.Result, ok, refill bool) {
	min := req.MinGrant()
	switch {
	case e.held() >= min:
		res, refill = s.spend(e, req, now)
		return res, true, refill
	case e.refused(now, min):
		s.emit(EventRefusalHit, 0)
		return e.refusalFromMemory(e.refusedUntil, now), true, false
	case now < e.pacedUntil:
		e.pacedRefused = true
		s.emit(EventPaced, 0)
		return e.refusalFromMemory(e.pacedUntil, now), true, false
	case s.refillsContended(e, now):
		// The pace is over and the lease empty: the refill goes in the background and the
		// check is refused from memory, as it would have been a moment earlier, instead of
		// waiting on the store (pace says which way this errs).
		if e.flight == nil {
			refill = s.enqueue(e)
			if e.flight == nil { // not queued (the queue is full, or the Store closing)
				e.contended = false // the next check calls in the foreground
			}
		}
		s.emit(EventPaced, 0)
		return e.refusalFromMemory(now+int64(refillWait), now), true, refill
	}
	return bucket.Result{}, false, false
}

// refillWait is the RetryAfter of a check refused while a contended key's refill is in
// flight: the refill lands within a round trip to the store, whose length is not known.
const refillWait = time.Millisecond

// spend answers a check from the lease and queues a refill if it fell to half a batch
// (with Config.SyncRefill it returns true instead: the caller runs s.refill(e) once it has
// released the lock). Called with the shard lock held and e.held() >= req.MinGrant().
func (s *Store) spend(e *entry, req *bucket.Request, now int64) (bucket.Result, bool) {
	g := min(e.held(), req.Want)
	e.spend(g)
	e.lastCost = req.MinGrant()
	held := e.held()
	res := bucket.Result{
		Granted:   g,
		Limiting:  e.limiting,
		Remaining: e.remaining + held,
		Reset:     time.Duration(max(e.resetAt-now, 0)),
		Source:    bucket.SourceLease,
	}
	s.emit(EventLeaseHit, g)
	if e.flight == nil && 2*held <= e.batch && s.leasing(e, now) &&
		now >= e.refillAfter && now >= e.pacedUntil && !e.refused(now, e.lastCost) {
		return res, s.enqueue(e)
	}
	return res, false
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

// callFor is a foreground call begun for a key: its flight, the request it sends, and
// what it was sized under.
type callFor struct {
	f       *flight
	req     bucket.Request
	gen     uint32
	peers   int
	ttl     int64 // how long what it is granted may be spent
	lease   bool
	opening bool  // the lease is a key's opening lot (leaseBatch)
	why     Event // why the check waits on it (entry.callReason)
}

// begin claims the one foreground call for e's key. Called with e's shard lock held. If
// the key is busy the call asks for a batch, else it passes the check through as it is.
func (s *Store) begin(e *entry, req *bucket.Request, now int64) callFor {
	c := callFor{f: &flight{done: make(chan struct{})}, req: *req, gen: e.gen, peers: s.peers()}
	e.flight = c.f
	batch, ttl, lease, opening := s.leaseBatch(e, req.Limits, req.Want, c.peers, now)
	c.ttl, c.opening, c.why = ttl, opening, e.callReason(lease)
	e.lapsed = false
	if lease {
		e.batch = batch
		c.req.Want, c.req.Min = batch, req.MinGrant()
	}
	c.lease = lease
	return c
}

// call makes the foreground call c for e's key (begun under the shard lock, which the
// caller has released) and keeps what the check does not spend.
func (s *Store) call(ctx context.Context, sh *shard, e *entry, req *bucket.Request, c callFor, start int64) (bucket.Result, error) {
	s.emit(EventCall, c.req.Want)
	s.emit(c.why, 0)
	res, err := s.take(ctx, &c.req)

	sh.mu.Lock()
	defer sh.mu.Unlock()
	f := c.f
	defer close(f.done)
	if e.flight == f {
		e.flight = nil
	}
	if err != nil {
		f.err, f.shared = err, ctx.Err() == nil
		s.emit(EventCallError, 0)
		return bucket.Result{}, err
	}
	current := c.gen == e.gen && !e.gone
	if current {
		e.observe(&c.req, res, start)
		if c.lease {
			e.setContended(!c.opening && res.Granted < c.req.Want, start, c.req.Limits, c.req.Want, c.peers, s.cfg.Window)
		}
	}
	if !c.lease || res.Granted == 0 {
		return res, nil
	}
	s.emit(EventGranted, res.Granted)
	if !current {
		// The limits changed (or the key was evicted) while we were asking: the check may
		// use what it was granted, the rest was taken under other limits and is dropped.
		g := min(res.Granted, req.Want)
		if d := res.Granted - g; d > 0 {
			s.emit(EventLimitsChanged, d)
		}
		res.Granted = g
		return res, nil
	}
	e.add(res.Granted, start+c.ttl)
	g := min(e.held(), req.Want)
	e.spend(g)
	e.lastCost = req.MinGrant()
	res.Granted = g
	res.Remaining += e.held()
	return res, nil
}

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
