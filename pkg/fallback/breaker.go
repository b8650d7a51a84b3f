package fallback

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// The shards' circuit breakers: one per shard (breakerFor), its state and a generation in
// one word. A finished call's outcome is judged first — only evidence about the shard
// counts (judge) — and then moves the breaker: settle for a call of the closed period,
// settleProbe for a probe. State and States read the breakers for metrics.

// maxBreakers bounds the breaker table. Shard names are Redis master addresses, a few dozen
// at most; if a buggy Shard function invents more, the rest share one breaker named
// OverflowShard rather than grow the table.
const maxBreakers = 1024

// OverflowShard names the breaker shared by shards beyond the table's bound.
const OverflowShard = "(overflow)"

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
