package fallback

import (
	"math"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// Local answers: a check its shard does not answer (an open breaker, a wait that passed, a
// failed call, the in-flight bound: LocalReason) is refused when its rule fails closed, and
// otherwise answered from the Store's own table at limit × Slack / N (N: the live
// enforcers of the region, or those that serve the key when Config.Seen knows fewer).

// scratch is the space answerLocally builds the scaled request in.
type scratch struct {
	limits [bucket.MaxLimits]bucket.Limit
	req    bucket.Request
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
	// Sized by the enforcers that serve the key, when this one is among them (it has a
	// recent count only if it sighted the key): docs/design.md §10 bounds the error.
	f := s.cfg.Slack / float64(s.peersFor(req.Identity))
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

// logSilence logs, at warn, the first check of a run answered locally because its wait
// passed (LocalWait) on a shard whose breaker stayed closed, silent since r (Unix µs): a
// run ends when the shard answers again. It says whether another shard answered
// meanwhile: if none did, the silence is more likely this process or its machine than
// the shard.
func (s *Store) logSilence(b *breaker, r, now int64) {
	if l := b.silenceLogged.Load(); l == r || !b.silenceLogged.CompareAndSwap(l, r) {
		return
	}
	s.log.Warn("redis shard silent: checks answered locally while its breaker stays closed",
		"shard", b.shard, "silent-for", time.Duration(now-r)*time.Microsecond,
		"in-flight", b.inFlight.Load(), "another-shard-answered", s.anyReplied.Load() > r)
}

// LocalKeys returns how many identities the local table holds (at most MaxLocalKeys,
// rounded up to a multiple of 64).
func (s *Store) LocalKeys() int { return s.local.Len() }
