package fallback

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/hashicorp/go-hclog"
)

// The Store and one check's way through it: Take validates the request, answers it from
// memory (Cache) while its shard's breaker is closed, and otherwise calls the next store
// (ask, call.go); a check whose breaker is not closed probes the shard or is answered
// locally (degraded, local.go). Close ends the calls in flight.

// ErrClosed is returned by Take after Close.
var ErrClosed = errors.New("fallback: store closed")

// Cache is implemented by a next store that can answer some requests from memory, without
// I/O (pkg/lease: leased tokens, the refusal cache). TakeCached is given a validated req
// (the Store validates once, first); it answers it and reports true when it can; when it
// reports false it has changed nothing, and the Store passes the check on (TakeValid when
// next is a bucket.ValidTaker, else Take). It must not block.
type Cache interface {
	TakeCached(req *bucket.Request) (bucket.Result, bool)
}

// Store decorates a bucket.Store with per-check waits, background calls, per-shard
// circuit breakers, degraded local limits and fail-closed refusals (see the package
// comment).
//
// Guarantees: a shard's breaker opens only on evidence about the shard (errors from it, a
// reply missing for ReplyTimeout while this process was running and another shard
// answered, or every shard silent for AllSilentFor), never because a check stopped
// waiting. Once open, no check on that shard calls the next store until its wait
// (FirstOpenFor, doubling up to OpenFor) has passed, and then exactly one does (the
// probe). With Config.Shard set, one shard's state never affects another's keys. Every
// check gets an answer within about Timeout (longer only while its shard is seen answering
// or has been silent under ReplyTimeout/2 since it was given work, up to ReplyTimeout, or
// ProbeTimeout for a probe) unless the request
// is invalid (bucket.ErrInvalid), the caller's context ends first (its error is returned;
// the call goes on), or the Store is closed.
//
// Cost: a check the next store answers from memory (Cache) makes no allocation and starts
// nothing; a check that calls the next store starts one goroutine and one context.
//
// The zero value is not usable: call New. Safe for concurrent use. Close is idempotent and
// waits for the calls in flight (cancelling them); it does not close next.
type Store struct {
	// mu guards adding breakers to the table (write lock) and closing against starting a
	// call (closed flips and calls.Add happen under it, so Close's Wait sees every call).
	mu       sync.RWMutex
	breakers atomic.Pointer[map[string]*breaker]
	one      *breaker // the breaker when Config.Shard is nil; the overflow one otherwise

	next    bucket.Store
	take    func(context.Context, *bucket.Request) (bucket.Result, error) // next's TakeValid (or Take)
	cache   Cache                                                         // next, when it can answer from memory; else nil
	settler bucket.Settler                                                // next, when it settles; else nil (settle.go)
	held    bucket.InflightStore                                          // next, when it holds in-flight slots; else nil (inflight.go)
	cfg     Config
	clock   clock.Clock
	real    bool // clock is clock.Real(): timers and deadlines are the runtime's
	log     hclog.Logger
	obs     Observer
	local   *bucket.Memory
	scratch sync.Pool // *scratch
	calls   sync.Pool // *call
	timers  sync.Pool // *time.Timer, real clock only
	closed  atomic.Bool
	// unclosed counts the breakers not closed: +1 when one opens from closed, -1 when a
	// probe closes it (the only ways into and out of Closed).
	unclosed  atomic.Int32
	decisions bool  // obs wants Decision (it is not DecisionsIgnored)
	meter     meter // stalls of this process (real clock only)
	// Across shards, for judge: the latest reply from any shard (Unix µs when it came) and
	// the latest send time of a call that got one. Only evidence a shard is alive moves them.
	anyReplied atomic.Int64
	anySent    atomic.Int64
	ctx        context.Context // parent of every call; cancelled by Close
	cancel     context.CancelFunc
	wg         sync.WaitGroup // calls in flight
}

// New returns a Store in front of next. It fails if cfg does not Validate.
func New(next bucket.Store, cfg Config) (*Store, error) {
	if next == nil {
		return nil, errors.New("fallback: next store is nil")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real()
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	_, ignored := cfg.Observer.(DecisionsIgnored)
	if cfg.Observer == nil {
		cfg.Observer, ignored = NopObserver{}, true
	}
	s := &Store{
		next:      next,
		take:      bucket.Validated(next),
		cfg:       cfg,
		clock:     cfg.Clock,
		real:      isReal(cfg.Clock),
		log:       cfg.Logger,
		obs:       cfg.Observer,
		local:     bucket.NewMemory(cfg.Clock, cfg.MaxLocalKeys),
		decisions: !ignored,
	}
	s.cache, _ = next.(Cache)
	s.held, _ = next.(bucket.InflightStore)
	s.settler, _ = next.(bucket.Settler)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.scratch.New = func() any { return new(scratch) }
	s.calls.New = func() any { return &call{done: make(chan struct{}, 1)} }
	name := ""
	if cfg.Shard != nil {
		name = OverflowShard
	}
	s.one = &breaker{shard: name}
	m := map[string]*breaker{}
	s.breakers.Store(&m)
	s.meter.gap = (cfg.ReplyTimeout / 4).Microseconds()
	if s.real { // a fake clock's stalls are the test's to make (see judge's lateness rule)
		s.wg.Add(1)
		go s.runMeter()
	}
	return s, nil
}

// Take implements bucket.Store. See Store for what it guarantees.
func (s *Store) Take(ctx context.Context, req *bucket.Request) (bucket.Result, error) {
	if s.closed.Load() {
		return bucket.Result{}, ErrClosed
	}
	// The one validation of the check path: the layers below are given the request by
	// TakeCached and TakeValid, which trust it (see bucket.ValidTaker).
	if err := req.Validate(); err != nil {
		return bucket.Result{}, err
	}
	// While every breaker is closed (unclosed is 0), a check that memory answers needs no
	// breaker: its shard's state is known to be Closed without looking the shard up.
	var b *breaker
	if s.unclosed.Load() != 0 {
		b = s.breakerFor(req.Identity)
		if w := b.word.Load(); stateOf(w) != Closed {
			return s.degraded(ctx, b, w, req)
		}
	}
	if s.cache != nil {
		if res, ok := s.cache.TakeCached(req); ok {
			if s.decisions {
				if b == nil {
					b = s.breakerFor(req.Identity)
				}
				s.obs.Decision(b.shard, res.Source, res.Granted > 0)
			}
			return res, nil
		}
	}
	if b == nil {
		b = s.breakerFor(req.Identity)
	}
	w := b.word.Load()
	if stateOf(w) != Closed { // it opened since unclosed was read
		return s.degraded(ctx, b, w, req)
	}
	return s.ask(ctx, b, w, req, false)
}

// testHookProbeRace, set by tests only, runs between a check seeing that a probe is due
// and its attempt to claim the probe, so a test can line many checks up there.
var testHookProbeRace func()

// degraded answers a check whose breaker was not closed: it probes if the breaker has waited
// its time open and this check wins the probe, else answers locally.
func (s *Store) degraded(ctx context.Context, b *breaker, w uint64, req *bucket.Request) (bucket.Result, error) {
	now := s.clock.Now()
	if stateOf(w) == Open && now.UnixMicro() >= b.openUntil.Load() {
		if testHookProbeRace != nil {
			testHookProbeRace()
		}
		if hw := bump(w, HalfOpen); b.word.CompareAndSwap(w, hw) {
			s.log.Info("probing redis shard", "shard", b.shard)
			s.obs.Transition(b.shard, Open, HalfOpen)
			return s.ask(ctx, b, hw, req, true)
		}
	}
	return s.answerLocally(b, req, now, LocalOpen)
}

// Close makes later Takes fail with ErrClosed, cancels the calls in flight and waits for
// their goroutines. It is idempotent. It does not close the next store.
func (s *Store) Close() error {
	s.mu.Lock()
	s.closed.Store(true)
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	return nil
}
