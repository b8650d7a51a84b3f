// Package fallback keeps a Redis outage from becoming an API outage (docs/design.md §7, promise
// P2), without loosening limits when Redis is healthy and this process is merely slow.
// Store is a bucket.Store decorator, the outermost layer of an enforcer
// (fallback → lease → redis).
//
// Two clocks, kept apart:
//
//   - A check waits Config.Timeout (5 ms) for the next store. That wait is about this
//     check: if it passes, this one check is answered locally, and nothing is concluded
//     about the shard.
//   - The call itself runs on a goroutine of the Store, under its own deadline,
//     Config.ReplyTimeout (100 ms), which go-redis puts on the socket. A check that
//     stops waiting does not cut the call short, so a slow moment of this process never
//     costs a connection (go-redis drops a connection whose read timed out).
//
// Each Redis shard has a circuit breaker, and only evidence about the shard moves it:
//
//   - a call's reply closes the run of errors (and, as a probe, the breaker);
//   - TripAfter consecutive errors from the shard (refused or reset connections, cluster
//     errors) open it;
//   - a call with no reply within ReplyTimeout opens it at once, unless the shard
//     answered after it was sent (it is alive), or this process was not running
//     meanwhile: the timeout was seen more than ReplyTimeout/2 late, or the Store's stall
//     meter (a 5 ms ticker, see meter) saw a gap over ReplyTimeout/4 since the call was
//     sent; the reply may then be sitting unread in the socket;
//   - and only if another shard answered a call sent after it: a shard silent while its
//     peers answer is the shard's fault. When every shard went quiet together it is more
//     likely this process or its machine (a loaded host starving the reads of every
//     connection at once), so the breaker waits until no shard has answered for
//     Config.AllSilentFor (500 ms) before it opens;
//   - while open no check calls the shard; then exactly one probe does. The first wait is
//     FirstOpenFor (250 ms), doubled after each failed probe up to OpenFor (2 s): a shard
//     that only missed replies for a moment is back on shared counts quickly, a dead one
//     costs one probe every 2 s.
//
// So a paused or dead master trips ReplyTimeout after the first call it does not answer
// (≈ 100 ms) while the other masters answer, a whole cluster down (or a shard whose peers
// have no traffic) in about AllSilentFor (≈ 500 ms), and a stall of this process (GC, a
// loaded 2-core VM: 20–30 ms, sometimes 200 ms) opens nothing: the replies of the calls it delayed arrive late and count as
// replies, and a reply missing across a stall proves nothing.
//
// While a shard's breaker is not closed, or a check's wait passed, the check is answered
// locally at limit × Slack / N, N the enforcers in the region, from a bounded in-memory
// bucket table; a request of a rule marked fail-closed is not answered but returned as
// bucket.ErrUnavailable with the wait until the shard is next tried (pkg/enforcer refuses
// it: the one place the fail mode is decided). A check whose wait passed keeps waiting while
// the shard has answered some call within the last ReplyTimeout/2, or when the wait ended
// late (this process was not running): under load, replies later than Timeout are still
// used rather than replaced by local answers. Every local answer is reported with its
// reason (Observer.Local: open breaker, the wait passed, the call failed, the in-flight
// bound); the first of a run whose wait passed on a closed breaker, the only kind a
// healthy cluster can cause, is also logged at warn.
//
// A next store that can answer from memory (Cache: pkg/lease's leased tokens and refusal
// cache) is asked first, on the checking goroutine, with no goroutine, timer or
// allocation; such answers say nothing about the shard.
//
// Which way it errs (docs/design.md §10): local limits err over. With traffic spread evenly over
// N enforcers a key is held near Slack × its limit (default 2×); traffic concentrated on
// fewer enforcers is held lower. A fail-closed rule errs under: it refuses everything on an
// unavailable shard. A check answered locally because its wait passed, whose call then
// succeeds, took its tokens from Redis without spending them (and spent local ones): that
// errs under for the shared limit, by at most the request's Want per such check; the
// answer itself is the local one (over, as above, for that one check).
//
// Bounds: at most MaxInFlight calls per shard are in flight (each lives at most
// ReplyTimeout, or ProbeTimeout); a check finding its shard at the bound is answered
// locally. Every call runs on a goroutine the Store owns, and so does the stall meter
// (real clock only); Close cancels them and waits.
//
// The deadline only reaches the socket if the go-redis client is made with
// ContextTimeoutEnabled: true; otherwise it waits its own ReadTimeout on a dead shard.
package fallback

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/hashicorp/go-hclog"
)

// ErrClosed is returned by Take after Close.
var ErrClosed = errors.New("fallback: store closed")

// maxBreakers bounds the breaker table. Shard names are Redis master addresses, a few dozen
// at most; if a buggy Shard function invents more, the rest share one breaker named
// OverflowShard rather than grow the table.
const maxBreakers = 1024

// OverflowShard names the breaker shared by shards beyond the table's bound.
const OverflowShard = "(overflow)"

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

// scratch is the space answerLocally builds the scaled request in.
type scratch struct {
	limits [bucket.MaxLimits]bucket.Limit
	req    bucket.Request
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

// breaker is one shard's circuit breaker. Its state and a generation live in one word, so
// a check reads both with one atomic load; every transition bumps the generation, which
// lets a call that began in an earlier period be recognised when it ends.
type breaker struct {
	// mu serializes opening from closed, the one transition several calls race for (the
	// probe is claimed by compare-and-swap, and only the prober ends half-open).
	mu        sync.Mutex
	word      atomic.Uint64 // generation<<2 | State
	fails     atomic.Int32  // consecutive errors in the current closed period
	openUntil atomic.Int64  // Unix µs when an open breaker may probe; stored before the word that publishes Open
	openFor   atomic.Int64  // µs: the current period's wait before its probe (see Config.FirstOpenFor)
	closedAt  atomic.Int64  // Unix µs when a probe last closed the breaker; 0: never
	replied   atomic.Int64  // Unix µs of the latest reply from the shard; 0: none yet
	woke      atomic.Int64  // Unix µs when a call last found the shard with none in flight
	// silenceLogged is the start of the silence logSilence last logged (Unix µs), so a
	// run of local answers is logged once.
	silenceLogged atomic.Int64
	inFlight      atomic.Int32 // calls in flight to the shard
	shard         string
}

const stateMask = 3

func stateOf(w uint64) State { return State(w & stateMask) }

// bump returns the word of the next period, in state st.
func bump(w uint64, st State) uint64 { return (w>>2+1)<<2 | uint64(st) }

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

// fromShard reports whether an answer came from the shard rather than from a layer's
// memory (leased tokens, the refusal cache): only the shard's own answers are evidence of
// its health. A key holding a lease keeps being answered from it while its shard is dead;
// its successes must not hide the failures of the keys that do reach the shard.
func fromShard(src bucket.Source) bool {
	return src != bucket.SourceLease && src != bucket.SourceRefusalCache
}

// outcome is what one call says about its shard.
type outcome int

const (
	replied   outcome = iota // the shard answered
	notJudged                // nothing learnt: answered from memory, invalid, Store closing, or a missed reply that proves nothing
	errored                  // the shard (or the way to it) returned an error
	silent                   // no reply within the call's deadline while this process was running
)

// judge classifies a finished call sent at sent (Unix µs), ended at end; probe says it
// was a probe (its deadline is ProbeTimeout).
func (s *Store) judge(b *breaker, res bucket.Result, err error, expired bool, sent, end int64, probe bool) outcome {
	d := s.deadline(probe)
	switch {
	case err == nil && fromShard(res.Source):
		return replied
	case err == nil, errors.Is(err, bucket.ErrInvalid), s.closed.Load():
		return notJudged
	case !expired:
		return errored
	case end-(sent+d.Microseconds()) > d.Microseconds()/2, s.meter.stalledSince(sent, end):
		return notJudged // this process was not running: the reply may be unread
	case b.replied.Load() > sent:
		return notJudged // the shard answered after this call was sent: it is alive
	case !probe && s.anySent.Load() <= sent && end-s.anyReplied.Load() < s.cfg.AllSilentFor.Microseconds():
		// No shard answered a call sent after this one, and some shard answered within
		// AllSilentFor: every shard went quiet together, which is likelier this process
		// or its machine than this shard. Not yet evidence to open a breaker (see
		// Config.AllSilentFor). A probe's missing reply is judged without it: the
		// breaker is open already, and judging it wrong only keeps it open one wait more.
		return notJudged
	}
	return silent
}

// settle applies a closed-period call's outcome to its breaker (probes: settleProbe).
func (s *Store) settle(b *breaker, w uint64, o outcome, err error, now time.Time) {
	switch o {
	case replied:
		if b.fails.Load() != 0 {
			b.fails.Store(0)
		}
		return
	case notJudged:
		return
	}
	s.obs.Failure(b.shard, err)
	if b.word.Load() != w {
		return // the breaker moved on while this call was in flight
	}
	if o == errored && b.fails.Add(1) < int32(s.cfg.TripAfter) {
		return
	}
	b.mu.Lock()
	tripped := b.word.Load() == w
	if tripped {
		d := s.cfg.FirstOpenFor.Microseconds()
		if c := b.closedAt.Load(); c != 0 && now.UnixMicro()-c < s.cfg.OpenFor.Microseconds() {
			d = s.longer(b.openFor.Load()) // it opens again soon after closing: back off
		}
		b.openFor.Store(d)
		b.openUntil.Store(now.UnixMicro() + d)
		b.fails.Store(0)
		b.word.Store(bump(w, Open))
		s.unclosed.Add(1)
	}
	b.mu.Unlock()
	if tripped {
		why := "errors"
		if o == silent {
			why = "no reply within " + s.cfg.ReplyTimeout.String()
		}
		s.log.Warn("redis shard unavailable: breaker open, enforcing local limits",
			"shard", b.shard, "why", why, "open-for", time.Duration(b.openFor.Load())*time.Microsecond, "error", err)
		s.obs.Transition(b.shard, Closed, Open)
	}
}

// settleProbe ends the half-open period hw with its probe's outcome: closed when the shard
// answered, open for twice the last wait (at most OpenFor) on an error or a missing reply. When the probe proved
// nothing (answered from memory, a late timeout, the Store closing) the breaker goes back
// to open with the probe due at once, so the next check probes.
func (s *Store) settleProbe(b *breaker, hw uint64, o outcome, err error, now time.Time) {
	switch o {
	case replied:
		b.fails.Store(0)
		b.closedAt.Store(now.UnixMicro())
		b.word.Store(bump(hw, Closed))
		s.unclosed.Add(-1)
		s.log.Info("redis shard answered: breaker closed", "shard", b.shard)
		s.obs.Transition(b.shard, HalfOpen, Closed)
	case notJudged:
		b.word.Store(bump(hw, Open)) // openUntil has passed: the next check probes
		s.log.Debug("probe did not judge the shard: probing again", "shard", b.shard, "error", err)
		s.obs.Transition(b.shard, HalfOpen, Open)
	default:
		s.obs.Failure(b.shard, err)
		d := s.longer(b.openFor.Load())
		b.openFor.Store(d)
		b.openUntil.Store(now.UnixMicro() + d)
		b.word.Store(bump(hw, Open))
		s.log.Warn("probe failed: breaker open again", "shard", b.shard, "open-for", time.Duration(d)*time.Microsecond, "error", err)
		s.obs.Transition(b.shard, HalfOpen, Open)
	}
}

// longer is the wait after one of d µs: doubled, within [FirstOpenFor, OpenFor].
func (s *Store) longer(d int64) int64 {
	return min(max(2*d, s.cfg.FirstOpenFor.Microseconds()), s.cfg.OpenFor.Microseconds())
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

// answerLocally answers a validated request without the next store: a fail-closed
// request is not answered but returned as bucket.ErrUnavailable, with the wait until the
// shard is next tried in RetryAfter (the caller refuses it: the fail mode is decided in
// pkg/enforcer only); any other is taken from the local table at limit × Slack / N.
//
// Both rate and burst are scaled. The local burst is at least the request's minimum grant
// (>= 1, and never above the real burst), so a request the real limit could admit is never
// refused forever by rounding; with many enforcers that errs over by at most that minimum
// per refill.
func (s *Store) answerLocally(b *breaker, req *bucket.Request, now time.Time, why LocalReason) (bucket.Result, error) {
	s.obs.Local(b.shard, why)
	if req.FailClosed {
		s.obs.Decision(b.shard, bucket.SourceFailClosed, false)
		return bucket.Result{Source: bucket.SourceFailClosed, RetryAfter: s.retryAfter(b, now)}, bucket.ErrUnavailable
	}
	n := 1
	if s.cfg.Peers != nil {
		if p := s.cfg.Peers(); p > 1 {
			n = p
		}
	}
	f := s.cfg.Slack / float64(n)
	minGrant := float64(req.MinGrant())
	// The scaled request is built in pooled scratch space: Memory keeps the limit names, so
	// a stack array would escape, and during an outage this is every check of the shard.
	sc := s.scratch.Get().(*scratch)
	lim := &sc.limits
	for i, l := range req.Limits {
		rate, burst := l.Rate*f, l.Burst*f
		if rate <= 0 {
			rate = math.SmallestNonzeroFloat64
		}
		if burst < minGrant {
			burst = minGrant
		}
		lim[i] = bucket.Limit{Name: l.Name, Rate: rate, Burst: burst}
	}
	sc.req = bucket.Request{Identity: req.Identity, Limits: lim[:len(req.Limits)], Want: req.Want, Min: req.Min}
	res := s.local.TakeAt(&sc.req, now.UnixMicro())
	sc.req = bucket.Request{}
	s.scratch.Put(sc)
	res.Source = bucket.SourceFallback
	s.obs.Decision(b.shard, bucket.SourceFallback, res.Granted > 0)
	return res, nil
}

// retryAfter is the wait until the shard is next tried: until the probe if the breaker is
// open, else (a probe in flight, or a check that stopped waiting) Timeout.
func (s *Store) retryAfter(b *breaker, now time.Time) time.Duration {
	if stateOf(b.word.Load()) == Open {
		if d := time.Duration(b.openUntil.Load()-now.UnixMicro()) * time.Microsecond; d > s.cfg.Timeout {
			return d
		}
	}
	return s.cfg.Timeout
}

// breakerFor returns the breaker of identity's shard, adding it on first sight.
func (s *Store) breakerFor(identity string) *breaker {
	if s.cfg.Shard == nil {
		return s.one
	}
	name := s.cfg.Shard(identity)
	if b, ok := (*s.breakers.Load())[name]; ok {
		return b
	}
	return s.addBreaker(name)
}

// addBreaker copies the table with a breaker for name: readers never lock, and the table
// changes only when a shard is first seen.
func (s *Store) addBreaker(name string) *breaker {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.breakers.Load()
	if b, ok := old[name]; ok {
		return b
	}
	if len(old) >= maxBreakers {
		return s.one
	}
	m := make(map[string]*breaker, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	b := &breaker{shard: name}
	m[name] = b
	s.breakers.Store(&m)
	return b
}

// State returns the state of shard's breaker (any name when Config.Shard is nil); Closed
// for a shard never seen.
func (s *Store) State(shard string) State {
	b := s.one
	if s.cfg.Shard != nil {
		var ok bool
		if b, ok = (*s.breakers.Load())[shard]; !ok {
			return Closed
		}
	}
	return stateOf(b.word.Load())
}

// States returns every known shard's breaker state, for a scrape-time metrics collector.
func (s *Store) States() map[string]State {
	if s.cfg.Shard == nil {
		return map[string]State{s.one.shard: stateOf(s.one.word.Load())}
	}
	m := *s.breakers.Load()
	out := make(map[string]State, len(m)+1)
	for k, b := range m {
		out[k] = stateOf(b.word.Load())
	}
	if w := s.one.word.Load(); w != 0 {
		out[s.one.shard] = stateOf(w)
	}
	return out
}

// LocalKeys returns how many identities the local table holds (at most MaxLocalKeys,
// rounded up to a multiple of 64).
func (s *Store) LocalKeys() int { return s.local.Len() }

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

func isInvalid(err error) bool { return errors.Is(err, bucket.ErrInvalid) }
