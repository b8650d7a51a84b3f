// Package fallback keeps a Redis outage from becoming an API outage (DESIGN.md §7, promise
// P2). Store is a bucket.Store decorator, the outermost layer of an enforcer
// (fallback → lease → redis):
//
//   - every call to the next store gets a deadline (Config.Timeout, default 5 ms; a probe
//     gets ProbeTimeout, default 50 ms);
//   - each Redis shard has a circuit breaker: after TripAfter consecutive failures on the
//     shard it opens for OpenFor, during which no check waits on that shard; then exactly
//     one check probes it (half-open): success closes the breaker, failure opens it again;
//   - while a shard is unavailable (its breaker is not closed, or the call just failed) a
//     check is answered locally at limit × Slack / N, N the enforcers in the region, from
//     a bounded in-memory bucket table; rules marked fail-closed are refused instead.
//
// A process starved of CPU misses deadlines on every shard at once. So when goroutines of
// this process have waited at least Timeout/2 to be scheduled since a shard's failures
// began (the Go runtime's scheduling-latency histogram), that shard's breaker opens only
// once the failures have lasted StallGrace (500 ms); see stalled.
//
// The breakers are driven by the checks and the clock alone: there is no goroutine.
//
// A failure is an error from the next store other than bucket.ErrInvalid and the caller's
// own cancellation; a missed deadline is one. An answer the next store gave from memory
// (bucket.SourceLease, bucket.SourceRefusalCache) says nothing about the shard: it neither
// resets the failure count nor closes a breaker.
//
// The deadline only helps if the next store honours its context: a go-redis client must be
// made with ContextTimeoutEnabled: true, or it ignores context deadlines and waits its own
// ReadTimeout (3 s by default) on a dead shard.
//
// Which way it errs (DESIGN.md §9): local limits err over. With traffic spread evenly over
// N enforcers a key is held near Slack × its limit (default 2×); traffic concentrated on
// fewer enforcers is held lower. A fail-closed rule errs under: it refuses everything on an
// unavailable shard.
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

// Store decorates a bucket.Store with per-shard deadlines, circuit breakers, degraded
// local limits and fail-closed refusals (see the package comment).
//
// Guarantees: once a shard's breaker is open, no check on that shard calls the next store
// until OpenFor has passed, and then exactly one does (the probe). With Config.Shard set, a
// check on a healthy shard is never answered locally because of another shard (a lone
// call of its own that misses its deadline is). Every check gets an answer
// unless the request is invalid (bucket.ErrInvalid), the caller's context ends first (its
// error is returned, and does not count against the shard), or the Store is closed.
//
// Cost: a check on a closed breaker makes one small allocation (its call context, see
// callCtx) and reads no clock unless the next store looks at its context; a check answered
// locally makes none.
//
// The zero value is not usable: call New. Safe for concurrent use. Close is idempotent; the
// Store starts no goroutines (a call's deadline timer lives no longer than the call; the
// caller owns next and closes it).
type Store struct {
	mu       sync.Mutex // mu serializes adding breakers to the table
	breakers atomic.Pointer[map[string]*breaker]
	list     atomic.Pointer[[]*breaker] // the same breakers (and one), for a quick scan
	one      *breaker                   // the breaker when Config.Shard is nil; the overflow one otherwise

	next        bucket.Store
	cfg         Config
	clock       clock.Clock
	clockIsReal bool
	log         hclog.Logger
	obs         Observer
	local       *bucket.Memory
	scratch     sync.Pool // *scratch
	closed      atomic.Bool
	// starve counts slow scheduling waits of this process (see stalled); nil when
	// StallGrace is 0. Tests replace it.
	starve func() uint64
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
	if cfg.Observer == nil {
		cfg.Observer = NopObserver{}
	}
	s := &Store{
		next:        next,
		cfg:         cfg,
		clock:       cfg.Clock,
		clockIsReal: isReal(cfg.Clock),
		log:         cfg.Logger,
		obs:         cfg.Observer,
		local:       bucket.NewMemory(cfg.Clock, cfg.MaxLocalKeys),
	}
	s.scratch.New = func() any { return new(scratch) }
	if cfg.StallGrace > 0 && s.clockIsReal {
		// The scheduler's latency is real time: it says nothing about a fake clock's.
		s.starve = newStarvation(cfg.Timeout / 2).slow
	}
	name := ""
	if cfg.Shard != nil {
		name = OverflowShard
	}
	s.one = &breaker{shard: name}
	m := map[string]*breaker{}
	s.breakers.Store(&m)
	l := []*breaker{s.one}
	s.list.Store(&l)
	return s, nil
}

// breaker is one shard's circuit breaker. Its state and a generation live in one word, so
// a check reads both with one atomic load; every transition bumps the generation, which
// lets a call that began in an earlier period be recognised when it ends.
type breaker struct {
	// mu serializes opening from closed, the one transition several checks race for (the
	// probe is claimed by compare-and-swap, and only the prober ends half-open).
	mu        sync.Mutex
	word      atomic.Uint64 // generation<<2 | State
	fails     atomic.Int32  // consecutive counted failures in the current closed period
	openUntil atomic.Int64  // Unix µs when an open breaker may probe; stored before the word that publishes Open
	shard     string

	// The stall guard (Config.StallGrace): when the current run of failures began (Unix
	// µs, 0: none), and the process's count of slow scheduling waits then.
	failSince atomic.Int64
	slowAt    atomic.Uint64

	// lat is the EWMA (weight 1/16) of the latency, in µs, of this shard's successful
	// round trips; 0 until the first. It sets the adaptive deadline (Config.MaxTimeout).
	lat atomic.Int64
}

// observe folds one successful round trip into b.lat. Concurrent updates may lose one
// another's sample; the average is a hint, not an account.
func (b *breaker) observe(d time.Duration) {
	x := d.Microseconds()
	if old := b.lat.Load(); old != 0 {
		x = old + (x-old)/16
	}
	b.lat.Store(max(x, 1))
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
	b := s.breakerFor(req.Identity)
	w := b.word.Load()
	if stateOf(w) != Closed {
		return s.degraded(ctx, b, w, req)
	}
	res, err := s.call(ctx, b, req, false)
	if err == nil {
		if !cached(res.Source) {
			if b.fails.Load() != 0 {
				b.fails.Store(0)
				b.failSince.Store(0)
			}
		}
		s.obs.Decision(b.shard, res.Source, res.Granted > 0)
		return res, nil
	}
	if !counts(ctx, err) {
		return bucket.Result{}, err
	}
	if verr := req.Validate(); verr != nil {
		return bucket.Result{}, verr
	}
	now := s.clock.Now()
	s.failed(b, w, err, now)
	return s.answerLocally(b, req, now), nil
}

// call asks the next store with the per-call deadline (ProbeTimeout for a probe). A check
// on a closed breaker reads the clock only if the next store looks at its context (see
// callCtx).
func (s *Store) call(ctx context.Context, b *breaker, req *bucket.Request, probe bool) (bucket.Result, error) {
	d := s.cfg.ProbeTimeout
	if !probe {
		d = s.timeout()
	}
	c := newCallCtx(ctx, s, d)
	res, err := s.next.Take(c, req)
	if start := c.release(); err == nil && !start.IsZero() && !cached(res.Source) {
		b.observe(s.clock.Now().Sub(start))
	}
	return res, err
}

// timeout is the adaptive per-call deadline (see Config.MaxTimeout): 4 × the lowest
// latency average over the known shards, within [Timeout, MaxTimeout]. The fastest shard
// measures this process and its network; a shard slower than that is judged against it.
func (s *Store) timeout() time.Duration {
	if s.cfg.MaxTimeout <= s.cfg.Timeout {
		return s.cfg.Timeout
	}
	var fastest int64
	for _, b := range *s.list.Load() {
		if l := b.lat.Load(); l != 0 && (fastest == 0 || l < fastest) {
			fastest = l
		}
	}
	d := 4 * time.Duration(fastest) * time.Microsecond
	return min(max(d, s.cfg.Timeout), s.cfg.MaxTimeout)
}

// cached reports whether an answer came from a layer's memory (leased tokens, the refusal
// cache) rather than from the shard: such a success says nothing about the shard's health,
// so it neither resets the failure count nor closes a breaker. A key holding a lease keeps
// being answered from it while its shard is dead; its successes must not hide the failures
// of the keys that do reach the shard.
func cached(src bucket.Source) bool {
	return src == bucket.SourceLease || src == bucket.SourceRefusalCache
}

// counts reports whether err is the shard's fault. An invalid request never reached it, and
// when the caller's own context has ended (cancelled, or its deadline, shorter than
// Timeout, passed) the call was cut short before the shard could be judged. A miss of the
// Store's own deadline leaves ctx alive and counts.
func counts(ctx context.Context, err error) bool {
	return !errors.Is(err, bucket.ErrInvalid) && ctx.Err() == nil
}

// failed counts a failure of a call that began in period w and opens the breaker on the
// TripAfter-th consecutive one.
func (s *Store) failed(b *breaker, w uint64, err error, now time.Time) {
	s.obs.Failure(b.shard, err)
	if b.word.Load() != w {
		return // the breaker moved on while this call was in flight
	}
	n := b.fails.Add(1)
	if n == 1 && s.starve != nil {
		b.failSince.Store(now.UnixMicro())
		b.slowAt.Store(s.starve())
	}
	if n < int32(s.cfg.TripAfter) || s.stalled(b, now) {
		return
	}
	b.mu.Lock()
	tripped := b.word.Load() == w
	if tripped {
		b.openUntil.Store(now.Add(s.cfg.OpenFor).UnixMicro())
		b.fails.Store(0)
		b.failSince.Store(0)
		b.word.Store(bump(w, Open))
	}
	b.mu.Unlock()
	if tripped {
		s.log.Warn("redis shard unavailable: breaker open, enforcing local limits",
			"shard", b.shard, "failures", s.cfg.TripAfter, "open-for", s.cfg.OpenFor, "error", err)
		s.obs.Transition(b.shard, Closed, Open)
	}
}

// stalled reports whether b, at TripAfter failures, should stay closed for now because
// its failures look like this process's stall rather than the shard's fault: since they
// began some goroutine of this process waited at least Timeout/2 to be scheduled (the Go
// runtime's scheduling-latency histogram), and they have lasted less than StallGrace.
//
// Which way it errs: a shard that dies while this process is starved of CPU opens up to
// StallGrace later, so for that long its checks wait up to Timeout before they are
// answered locally — slower, never refused. A starved process no longer opens breakers
// on healthy shards, which put their keys on local limits (over, up to Slack×) for
// OpenFor after every stall.
func (s *Store) stalled(b *breaker, now time.Time) bool {
	if s.starve == nil {
		return false
	}
	since := b.failSince.Load()
	if since == 0 || now.UnixMicro()-since >= s.cfg.StallGrace.Microseconds() {
		return false
	}
	return s.starve() != b.slowAt.Load()
}

// testHookProbeRace, set by tests only, runs between a check seeing that a probe is due
// and its attempt to claim the probe, so a test can line many checks up there.
var testHookProbeRace func()

// degraded answers a check whose breaker was not closed: it probes if the breaker has been
// open for OpenFor and this check wins the probe, else answers locally.
func (s *Store) degraded(ctx context.Context, b *breaker, w uint64, req *bucket.Request) (bucket.Result, error) {
	if err := req.Validate(); err != nil {
		return bucket.Result{}, err
	}
	now := s.clock.Now()
	if stateOf(w) == Open && now.UnixMicro() >= b.openUntil.Load() {
		if testHookProbeRace != nil {
			testHookProbeRace()
		}
		if hw := bump(w, HalfOpen); b.word.CompareAndSwap(w, hw) {
			s.log.Info("probing redis shard", "shard", b.shard)
			s.obs.Transition(b.shard, Open, HalfOpen)
			return s.probe(ctx, b, hw, req)
		}
	}
	return s.answerLocally(b, req, now), nil
}

// probe makes the one call of a half-open period hw and ends the period: closed when the
// shard answered, open for another OpenFor on a failure. When the shard was not judged —
// the answer came from a cache below, or the caller gave up — the breaker goes back to open
// with the probe due at once, so the next check probes.
func (s *Store) probe(ctx context.Context, b *breaker, hw uint64, req *bucket.Request) (bucket.Result, error) {
	res, err := s.call(ctx, b, req, true)
	if err == nil && !cached(res.Source) {
		b.fails.Store(0)
		b.word.Store(bump(hw, Closed))
		s.log.Info("redis shard answered: breaker closed", "shard", b.shard)
		s.obs.Transition(b.shard, HalfOpen, Closed)
		s.obs.Decision(b.shard, res.Source, res.Granted > 0)
		return res, nil
	}
	if err == nil || !counts(ctx, err) {
		b.word.Store(bump(hw, Open)) // openUntil has passed: the next check probes
		s.log.Debug("probe did not reach the shard: probing again", "shard", b.shard, "source", res.Source, "error", err)
		s.obs.Transition(b.shard, HalfOpen, Open)
		if err != nil {
			return bucket.Result{}, err
		}
		s.obs.Decision(b.shard, res.Source, res.Granted > 0)
		return res, nil
	}
	now := s.clock.Now()
	s.obs.Failure(b.shard, err)
	b.openUntil.Store(now.Add(s.cfg.OpenFor).UnixMicro())
	b.word.Store(bump(hw, Open))
	s.log.Warn("probe failed: breaker open again", "shard", b.shard, "open-for", s.cfg.OpenFor, "error", err)
	s.obs.Transition(b.shard, HalfOpen, Open)
	return s.answerLocally(b, req, now), nil
}

// answerLocally answers a validated request without the next store: a fail-closed
// request is refused until the next probe; any other is taken from the local table at
// limit × Slack / N.
//
// Both rate and burst are scaled. The local burst is at least the request's minimum grant
// (>= 1, and never above the real burst), so a request the real limit could admit is never
// refused forever by rounding; with many enforcers that errs over by at most that minimum
// per refill.
func (s *Store) answerLocally(b *breaker, req *bucket.Request, now time.Time) bucket.Result {
	if req.FailClosed {
		s.obs.Decision(b.shard, bucket.SourceFailClosed, false)
		return bucket.Result{Source: bucket.SourceFailClosed, RetryAfter: s.retryAfter(b, now)}
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
	return res
}

// retryAfter is the wait until the shard is next tried: until the probe if the breaker is
// open, else (a probe in flight, or a single failure on a closed breaker) Timeout.
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
	l := append(append([]*breaker(nil), *s.list.Load()...), b)
	s.list.Store(&l)
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

// Close makes later Takes fail with ErrClosed. It is idempotent and waits for nothing:
// the Store owns no goroutine. It does not close the next store.
func (s *Store) Close() error {
	s.closed.Store(true)
	return nil
}
