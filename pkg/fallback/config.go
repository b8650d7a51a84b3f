package fallback

import (
	"fmt"
	"math"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/hashicorp/go-hclog"
)

// Config configures a Store. Start from DefaultConfig and change what differs; New rejects
// a Config that fails Validate. Nil Clock, Logger and Observer are filled in by New (real
// clock, no logs, no metrics); the numbers have no implicit defaults, so a zero Config is
// rejected with a message naming each field.
type Config struct {
	// Clock tells the time for breakers, waits, call deadlines and the local buckets. Nil
	// means clock.Real().
	Clock clock.Clock

	// Shard names the Redis shard that owns an identity (bucket.Redis.ShardOf: the address
	// of the master owning the identity's slot). Each distinct name gets its own breaker,
	// so one bad shard degrades only its own keys. Nil means one shard: one breaker for
	// every identity. It is called on every check, so it should be cheap and must not
	// allocate to keep the hot path allocation-free.
	Shard func(identity string) string

	// Timeout is how long a check waits for the next store's answer before it is answered
	// locally. It judges this check only, never the shard: the call goes on in the
	// background (see ReplyTimeout), and its outcome, when it comes, is what the breaker
	// hears. A check whose wait passes keeps waiting, one Timeout at a time, while the
	// shard has answered some call within the last ReplyTimeout/2 or the wait itself ended
	// late (this process was not running), up to ReplyTimeout. Default 5 ms.
	Timeout time.Duration

	// ReplyTimeout is the deadline of every call to the next store (its context's, which
	// go-redis with ContextTimeoutEnabled puts on the socket). A call with no reply by then
	// is evidence that the shard is not answering, and opens its breaker at once, unless
	// the shard answered another call sent after it or the timeout was seen more than
	// ReplyTimeout/2 late (this process stalled across it). It is also how long a paused
	// master takes to trip. Must be >= Timeout. Default 100 ms.
	ReplyTimeout time.Duration

	// AllSilentFor is how long no shard at all may have answered before a missing reply
	// opens a breaker when no other shard can vouch for this process. A reply missing for
	// ReplyTimeout is evidence against its shard only if another shard answered a call
	// sent after it (this process and its network were working, that shard was not);
	// when every shard went quiet together the likelier cause is this process or its
	// machine (a stall the meter missed, a loaded host starving the reads), and local
	// limits then would loosen every key for OpenFor. So the breaker opens only once no
	// shard has answered for AllSilentFor: a whole cluster that died (or a network cut to
	// all of it), or a shard whose peers have no traffic, trips in about AllSilentFor
	// instead of ReplyTimeout. Must be >= ReplyTimeout. Default 500 ms.
	AllSilentFor time.Duration

	// ProbeTimeout is the deadline of the one call that probes a shard whose breaker has
	// waited its time open (FirstOpenFor, doubling up to OpenFor). The first call to a
	// shard that came back may pay for dialling it again, and a probe that misses keeps
	// the shard's keys on local limits for a wait twice as long. Default 100 ms.
	ProbeTimeout time.Duration

	// TripAfter is how many consecutive errors from one shard (a refused or reset
	// connection, a cluster error: anything but a missing reply, an invalid request or the
	// Store closing) open its breaker. Default 5.
	TripAfter int

	// FirstOpenFor is how long a breaker that opens from closed stays open before it lets
	// one probe through; each failed probe doubles the wait, up to OpenFor, and a breaker
	// that opens again within OpenFor of closing starts from double its last wait. A shard
	// that missed replies for a moment (a Redis process descheduled on a loaded host, a
	// failover's first second) is back on shared counts after FirstOpenFor rather than
	// OpenFor, while a dead shard is still probed once per OpenFor soon after. Must be in
	// (0, OpenFor]. Default 250 ms.
	FirstOpenFor time.Duration

	// OpenFor is the longest an open breaker stays open before it lets one probe through
	// to the next store (see FirstOpenFor). Default 2 s.
	OpenFor time.Duration

	// MaxInFlight bounds the calls in flight to one shard, answered or not: a check that
	// finds its shard at the bound is answered locally without a call. It bounds the
	// goroutines and connections a dead shard can hold (each call lives at most
	// ReplyTimeout). Default 256.
	MaxInFlight int

	// Inline calls the next store on the checking goroutine and waits for its answer, with
	// no wait timer, call goroutine or reply deadline: for a next store that answers at
	// once and cannot hang — the in-memory store, or regionsim's virtual mode, whose clock
	// is virtual — where a goroutine and two timers per call are all cost. The breaker
	// still hears every outcome (TripAfter consecutive errors open it; a probe closes
	// it). Never for Redis: a hung shard would hang the check. Default false.
	Inline bool

	// Peers returns N, the number of enforcers live in the region; the local limits while
	// a shard is unavailable are limit × Slack / N. It is called only on the degraded path.
	// Nil, or an answer below 1, means 1: this enforcer alone, which errs over by a factor
	// of the real N.
	Peers func() int

	// Seen, if not nil, returns how many enforcers of the region serve identity (pkg/lease's
	// Store.Seen: the count Redis kept of the enforcers that sighted the key lately), or 0
	// when unknown. A key's local limits are then limit × Slack / min(N, Seen): a key served
	// by 3 of 100 enforcers keeps two thirds of its limit on each of them during an outage,
	// not 2%. Called once per local answer; it must be cheap and safe for concurrent use.
	Seen func(identity string) int

	// Slack multiplies the local share of a limit to allow for traffic spread unevenly over
	// the enforcers (a key whose traffic all lands on one enforcer still gets
	// limit × Slack / N there). Must be finite and > 0. Default 2.
	Slack float64

	// MaxLocalKeys bounds how many identities the local bucket table remembers (rounded
	// up to a multiple of 64, the table's shard count). Default 100,000.
	MaxLocalKeys int

	// Logger receives one line per breaker transition. Nil means no logs.
	Logger hclog.Logger

	// Observer receives breaker transitions and decisions, for metrics. Nil means none.
	Observer Observer
}

// Defaults, from docs/design.md §7.
const (
	DefaultTimeout      = 5 * time.Millisecond
	DefaultReplyTimeout = 100 * time.Millisecond
	DefaultProbeTimeout = 100 * time.Millisecond
	DefaultAllSilentFor = 500 * time.Millisecond
	DefaultTripAfter    = 5
	DefaultOpenFor      = 2 * time.Second
	DefaultFirstOpenFor = 250 * time.Millisecond
	DefaultMaxInFlight  = 256
	DefaultSlack        = 2.0
	DefaultMaxLocalKeys = 100_000
)

// DefaultConfig returns the defaults: real clock, one shard, checks wait 5 ms, calls live
// 100 ms (a probe too), open after 5 consecutive errors or one missing reply (500 ms of
// silence from every shard when no other shard answered meanwhile) for 2 s, 256
// calls in flight per shard, N = 1, Slack 2, 100,000 local keys, no logs, no metrics.
func DefaultConfig() Config {
	return Config{
		Clock:        clock.Real(),
		Timeout:      DefaultTimeout,
		ReplyTimeout: DefaultReplyTimeout,
		ProbeTimeout: DefaultProbeTimeout,
		AllSilentFor: DefaultAllSilentFor,
		TripAfter:    DefaultTripAfter,
		OpenFor:      DefaultOpenFor,
		FirstOpenFor: DefaultFirstOpenFor,
		MaxInFlight:  DefaultMaxInFlight,
		Slack:        DefaultSlack,
		MaxLocalKeys: DefaultMaxLocalKeys,
	}
}

// maxCount keeps TripAfter and MaxInFlight inside the int32 counters.
const maxCount = 1 << 30

// Validate reports the first field that is out of range, naming it and its value.
func (c Config) Validate() error {
	switch {
	case c.Timeout <= 0:
		return fmt.Errorf("fallback: config: Timeout %v, must be > 0", c.Timeout)
	case c.ReplyTimeout < c.Timeout:
		return fmt.Errorf("fallback: config: ReplyTimeout %v, must be >= Timeout (%v)", c.ReplyTimeout, c.Timeout)
	case c.AllSilentFor < c.ReplyTimeout:
		return fmt.Errorf("fallback: config: AllSilentFor %v, must be >= ReplyTimeout (%v)", c.AllSilentFor, c.ReplyTimeout)
	case c.ProbeTimeout <= 0:
		return fmt.Errorf("fallback: config: ProbeTimeout %v, must be > 0", c.ProbeTimeout)
	case c.TripAfter < 1 || c.TripAfter > maxCount:
		return fmt.Errorf("fallback: config: TripAfter %d, must be in [1, %d]", c.TripAfter, maxCount)
	case c.OpenFor <= 0:
		return fmt.Errorf("fallback: config: OpenFor %v, must be > 0", c.OpenFor)
	case c.FirstOpenFor <= 0 || c.FirstOpenFor > c.OpenFor:
		return fmt.Errorf("fallback: config: FirstOpenFor %v, must be in (0, OpenFor (%v)]", c.FirstOpenFor, c.OpenFor)
	case c.MaxInFlight < 1 || c.MaxInFlight > maxCount:
		return fmt.Errorf("fallback: config: MaxInFlight %d, must be in [1, %d]", c.MaxInFlight, maxCount)
	case math.IsNaN(c.Slack) || math.IsInf(c.Slack, 0) || c.Slack <= 0:
		return fmt.Errorf("fallback: config: Slack %g, must be finite and > 0", c.Slack)
	case c.MaxLocalKeys < 1:
		return fmt.Errorf("fallback: config: MaxLocalKeys %d, must be >= 1", c.MaxLocalKeys)
	}
	return nil
}

// State is the state of one shard's breaker.
type State uint32

// The breaker states.
const (
	// Closed: checks go to the next store.
	Closed State = iota
	// Open: checks are answered locally (or refused, if fail-closed) without calling the
	// next store, until its wait (FirstOpenFor, doubling up to OpenFor) has passed.
	Open
	// HalfOpen: one probe is in flight to the next store; every other check is answered
	// as if Open.
	HalfOpen
)

var stateNames = [...]string{"closed", "open", "half-open"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint32(s))
}

// Observer receives what a Store does, for metrics. Shard names come from Config.Shard, so
// a label set built from them is bounded by the number of shards. Methods are called on the
// checking goroutine or the goroutine of a call (Decision on every check), so they must be
// quick, must not block and must be safe for concurrent use. Embed NopObserver to
// implement only some of them.
type Observer interface {
	// Transition reports a breaker changing state, once per transition.
	Transition(shard string, from, to State)
	// Failure reports a call to the next store that ended in an error about its shard: an
	// error other than bucket.ErrInvalid and the Store closing, including no reply within
	// ReplyTimeout. A check that stopped waiting (Timeout) is not a failure.
	Failure(shard string, err error)
	// Decision reports every answer the Store gives: source is the next store's own
	// (redis, lease, ...) when it answered, else bucket.SourceFallback or
	// bucket.SourceFailClosed.
	Decision(shard string, source bucket.Source, allowed bool)
	// Local reports a check the Store answered without the next store (locally, or
	// fail-closed), and why. Every such check is reported once, whether or not
	// Decision is.
	Local(shard string, why LocalReason)
}

// LocalReason says why a check was answered without the next store.
type LocalReason uint8

const (
	// LocalOpen: the shard's breaker was open or half-open (an outage, as the breaker
	// judged it).
	LocalOpen LocalReason = iota
	// LocalWait: the shard's breaker was closed, but the check's wait passed while the
	// shard had been silent for ReplyTimeout/2 and this process was running. On a healthy
	// cluster this is the one way a local answer happens: a reply that late from a live
	// shard (see ask). The Store logs the first of each run at warn.
	LocalWait
	// LocalError: the check's own call failed (an error from the shard or the way to it,
	// or no reply by its deadline).
	LocalError
	// LocalBound: the shard already had MaxInFlight calls in flight.
	LocalBound
	// NumLocalReasons is the number of reasons.
	NumLocalReasons
)

var localReasonNames = [NumLocalReasons]string{"open", "wait", "error", "bound"}

func (r LocalReason) String() string {
	if r < NumLocalReasons {
		return localReasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// DecisionsIgnored is implemented by an Observer whose Decision does nothing: the Store then
// does not look up a check's shard to tell it of an answer from memory, which is most
// answers (a lookup in the cluster client's slot table, ~3% of the enforcer's CPU under
// load). A nil Config.Observer counts as one. NopObserver does not implement it, so a
// type that embeds NopObserver and defines Decision is told of every decision.
type DecisionsIgnored interface {
	Observer
	DecisionsIgnored()
}

// NopObserver ignores everything. Its zero value is ready to use.
type NopObserver struct{}

// Transition implements Observer.
func (NopObserver) Transition(string, State, State) {}

// Failure implements Observer.
func (NopObserver) Failure(string, error) {}

// Decision implements Observer.
func (NopObserver) Decision(string, bucket.Source, bool) {}

// Local implements Observer.
func (NopObserver) Local(string, LocalReason) {}
