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
	// Clock tells the time for breakers, per-call deadlines and the local buckets. Nil
	// means clock.Real().
	Clock clock.Clock

	// Shard names the Redis shard that owns an identity (bucket.Redis.ShardOf: the address
	// of the master owning the identity's slot). Each distinct name gets its own breaker,
	// so one bad shard degrades only its own keys. Nil means one shard: one breaker for
	// every identity. It is called on every check, so it should be cheap and must not
	// allocate to keep the hot path allocation-free.
	Shard func(identity string) string

	// Timeout is the deadline given to every call to the next store (as a context
	// deadline). A call that misses it counts as a failure of its shard. Default 5 ms.
	Timeout time.Duration

	// ProbeTimeout is the deadline of the one call that probes a shard whose breaker has
	// been open for OpenFor. Longer than Timeout because the first call to a shard that
	// came back may pay for dialling it again, and a probe that misses its deadline keeps
	// the shard's keys on local limits for another OpenFor; only one check per shard per
	// OpenFor waits on it. Default 50 ms.
	ProbeTimeout time.Duration

	// MaxTimeout caps the adaptive per-call deadline. The deadline of a call is
	// 4 × the recent latency (EWMA) of the fastest shard's successful calls, at least Timeout
	// and at most MaxTimeout: when every shard is slow at once — this process or host is
	// saturated — deadlines stretch instead of failing healthy calls (which would open every
	// breaker and loosen every limit to local ones), while one shard much slower than the
	// fastest still misses Timeout-sized deadlines and trips. It errs slower: on a
	// saturated process a check may wait up to MaxTimeout for a dead shard until its breaker
	// opens. At or below Timeout (0 included) the deadline is Timeout: no adaptation.
	// Default 25 ms.
	MaxTimeout time.Duration

	// TripAfter is how many consecutive failures on one shard open its breaker. Default 5.
	TripAfter int

	// OpenFor is how long an open breaker stays open before it lets one probe through to
	// the next store. Default 2 s.
	OpenFor time.Duration

	// StallGrace tells a shard's failure from this process's own stall. When a shard
	// reaches TripAfter consecutive failures and, since they began, goroutines of this
	// process have waited at least Timeout/2 to be scheduled (the Go runtime's
	// scheduling-latency histogram: a saturated host, a GC pause), the deadline misses say
	// more about this process than about the shard, and the breaker opens only once the
	// failures have lasted StallGrace. The failed checks are answered locally meanwhile, as
	// always; the breaker just does not keep healthy shards' keys on local limits for
	// OpenFor after every stall. A process that was not starved opens at TripAfter as
	// before. 0 disables the guard, and so does a Clock other than clock.Real() (the
	// scheduler's latency is real time). Default 500 ms.
	StallGrace time.Duration

	// Peers returns N, the number of enforcers live in the region; the local limits while
	// a shard is unavailable are limit × Slack / N. It is called only on the degraded path.
	// Nil, or an answer below 1, means 1: this enforcer alone, which errs over by a factor
	// of the real N.
	Peers func() int

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

// Defaults, from DESIGN.md §7.
const (
	DefaultTimeout      = 5 * time.Millisecond
	DefaultProbeTimeout = 50 * time.Millisecond
	DefaultMaxTimeout   = 25 * time.Millisecond
	DefaultTripAfter    = 5
	DefaultOpenFor      = 2 * time.Second
	DefaultStallGrace   = 500 * time.Millisecond
	DefaultSlack        = 2.0
	DefaultMaxLocalKeys = 100_000
)

// DefaultConfig returns the defaults: real clock, one shard, 5 ms per call (50 ms for a
// probe), open after 5 consecutive failures for 2 s (after 500 ms when every shard fails
// at once), N = 1, Slack 2, 100,000 local keys,
// no logs, no metrics.
func DefaultConfig() Config {
	return Config{
		Clock:        clock.Real(),
		Timeout:      DefaultTimeout,
		ProbeTimeout: DefaultProbeTimeout,
		MaxTimeout:   DefaultMaxTimeout,
		TripAfter:    DefaultTripAfter,
		OpenFor:      DefaultOpenFor,
		StallGrace:   DefaultStallGrace,
		Slack:        DefaultSlack,
		MaxLocalKeys: DefaultMaxLocalKeys,
	}
}

// maxTripAfter keeps TripAfter inside the int32 failure counter.
const maxTripAfter = 1 << 30

// Validate reports the first field that is out of range, naming it and its value.
func (c Config) Validate() error {
	switch {
	case c.Timeout <= 0:
		return fmt.Errorf("fallback: config: Timeout %v, must be > 0", c.Timeout)
	case c.MaxTimeout < 0:
		return fmt.Errorf("fallback: config: MaxTimeout %v, must be >= 0", c.MaxTimeout)
	case c.ProbeTimeout <= 0:
		return fmt.Errorf("fallback: config: ProbeTimeout %v, must be > 0", c.ProbeTimeout)
	case c.TripAfter < 1 || c.TripAfter > maxTripAfter:
		return fmt.Errorf("fallback: config: TripAfter %d, must be in [1, %d]", c.TripAfter, maxTripAfter)
	case c.OpenFor <= 0:
		return fmt.Errorf("fallback: config: OpenFor %v, must be > 0", c.OpenFor)
	case c.StallGrace < 0:
		return fmt.Errorf("fallback: config: StallGrace %v, must be >= 0 (0 disables it)", c.StallGrace)
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
	// next store, until OpenFor has passed since the breaker opened.
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
// checking goroutine (Decision on every check), so they must be quick, must not block and
// must be safe for concurrent use. Embed NopObserver to implement only some of them.
type Observer interface {
	// Transition reports a breaker changing state, once per transition.
	Transition(shard string, from, to State)
	// Failure reports a call to the next store that counted against its shard (an error
	// other than bucket.ErrInvalid and the caller's own cancellation, including a missed
	// Timeout).
	Failure(shard string, err error)
	// Decision reports every answer the Store gives: source is the next store's own
	// (redis, lease, ...) when it answered, else bucket.SourceFallback or
	// bucket.SourceFailClosed.
	Decision(shard string, source bucket.Source, allowed bool)
}

// NopObserver ignores everything. Its zero value is ready to use.
type NopObserver struct{}

// Transition implements Observer.
func (NopObserver) Transition(string, State, State) {}

// Failure implements Observer.
func (NopObserver) Failure(string, error) {}

// Decision implements Observer.
func (NopObserver) Decision(string, bucket.Source, bool) {}
