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

// The Store and a check's way through it: Take and TakeValid (and TakeCached, pkg/fallback's
// way in) find the key's entry (table.go), bring it up to date (refresh) and answer from
// memory when they can — leased tokens, the refusal cache, pacing (fromMemory, spend) —
// and otherwise begin the key's one call (call.go), which the checks that miss meanwhile
// wait for.

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

// peersOf is what e's key is sized by: N, or, for a busy key, the enforcers that serve it
// (the store's count from a reply at most SightTTL old) when fewer. A key that is not busy
// keeps N: a small key spread over a few enforcers, each holding a larger quiet lot, would
// strand its few tokens on one of them. Called with e's shard lock held.
func (s *Store) peersOf(e *entry, now int64) int {
	p := s.peers()
	// A count is believed from the second sighting on (SightEvery after the first, when
	// the other enforcers that serve the key busily have sighted it too), and for
	// SightTTL after the reply that carried it.
	if e.seen > 0 && e.seen < p && now-e.seenAt < int64(s.cfg.SightTTL) && e.seenAt-e.sightFrom >= int64(s.cfg.SightEvery) && e.busy(s.busyHits) {
		return e.seen
	}
	return p
}

// sight adds a sighting of e's busy key to req when one is due. Called with e's shard
// lock held.
func (s *Store) sight(e *entry, req *bucket.Request, now int64) {
	if s.cfg.ID == "" || !e.busy(s.busyHits) || (e.sighted && now-e.sightAt < int64(s.cfg.SightEvery)) {
		return
	}
	if !e.sighted || now-e.sightAt >= int64(s.cfg.SightTTL) {
		e.sightFrom = now // a new run of sightings
	}
	e.sightAt, e.sighted = now, true
	req.Sight, req.SightTTL = s.cfg.ID, s.cfg.SightTTL
}

// Seen returns how many enforcers of the region serve identity, as the store counted them
// at most SightTTL ago and at least SightEvery after this enforcer began sighting the key,
// or 0 when this enforcer has no such count (it has not sighted the key, or not lately). pkg/fallback sizes its local limits by it during an outage.
func (s *Store) Seen(identity string) int {
	sh := s.shardOf(identity)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[identity]
	if e == nil || e.seen == 0 || s.now()-e.seenAt >= int64(s.cfg.SightTTL) || e.seenAt-e.sightFrom < int64(s.cfg.SightEvery) {
		return 0
	}
	return e.seen
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
		var landed <-chan struct{}
		if f == nil {
			c = s.begin(sh, e, req, now)
		} else {
			// Someone is calling for this key: it is busy; wait for that call and look again.
			e.hits = max(e.hits, s.busyHits)
			landed = f.wait()
		}
		sh.mu.Unlock()
		if f == nil {
			return s.call(ctx, sh, e, req, c, now)
		}
		if s.hooks.waiting != nil {
			s.hooks.waiting()
		}
		select {
		case <-landed:
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
	if !e.sameLimits(req.Limits) {
		if d := e.setLimits(sh.internLimits(req.Limits)); d > 0 {
			s.emit(EventLimitsChanged, d)
		}
	}
	if e.penalty != req.Penalty {
		e.penalty = req.Penalty // a compiled rule's: one pointer per rules snapshot
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
		e.countRefusal(now)
		return e.refusalFromMemory(e.refusedUntil, now), true, false
	case now < e.pacedUntil:
		e.pacedRefused = true
		e.countRefusal(now)
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
		e.countRefusal(now)
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
