package lease

import (
	"errors"
	"fmt"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
)

// ErrConfig is wrapped by every error Config.Validate returns.
var ErrConfig = errors.New("lease: invalid config")

// ErrClosed is returned by Take once the Store is closed.
var ErrClosed = errors.New("lease: store closed")

// Config tunes a Store. Start from DefaultConfig and change what you need; the zero Config
// is not valid (New rejects it with an error naming the field).
type Config struct {
	// Clock is the time source; leases expire and refusal-cache entries run out by it.
	// Default clock.Real(). Tests inject a *clock.Fake.
	Clock clock.Clock

	// Peers returns N, the number of enforcers in the region sharing each limit; a batch is
	// this enforcer's 1/N part of a window of the limit. Called once per call to the next
	// store (never on the leased fast path); it must be cheap and safe for concurrent use.
	// nil, or a result below 1, means 1.
	Peers func() int

	// LeaseTTL is how long a busy lease's tokens may be spent, counted from when the call
	// that took them was sent (a quiet lease's: QuietTTL). It bounds how long unused tokens
	// stay stranded. Expired tokens are dropped, never revived. Default 1s.
	LeaseTTL time.Duration

	// QuietTTL is how long a quiet lease's tokens may be spent (see "Quiet keys" in the
	// package comment), and the period over which a key's slow demand is measured: a key
	// seen at least twice per QuietTTL is leased its own demand over one QuietTTL, so it
	// costs about one call per QuietTTL, in the background, instead of one per check in
	// the foreground. It changes how long a quiet lease's tokens may stay stranded, not
	// how many: a quiet batch is capped at a quarter of LeaseTTL's worth of the limit per
	// enforcer. Must be >= LeaseTTL. Default 2m.
	QuietTTL time.Duration

	// Window is the slice of the limit one batch covers (rate × Window / N), and the period
	// over which busyness and demand are counted. Must be <= LeaseTTL. Default 100ms.
	Window time.Duration

	// BusyHits is the busyness threshold: a key is leased only once this enforcer has seen
	// at least BusyHits checks for it within one Window (or a check arrived while a call
	// for it was in flight). Below it every check is the exact per-request call to the next
	// store. Default 3 (≈ 30 checks/s per enforcer at the default Window).
	BusyHits int

	// MaxKeys is the hard bound on the number of keys the table holds (leases, refusal
	// cache entries and busyness counters alike). When full, inserting a key evicts the
	// least recently used one in its shard, in O(1), recency counted to within a quarter
	// of the shard (table.go). Default 65536 (≈ 20 MiB at the ≈ 300 B an entry costs).
	MaxKeys int

	// Refillers is the number of goroutines making background refills; it bounds how many
	// refill calls are in flight at once. Default 4.
	Refillers int

	// RefillQueue is how many refills may wait for a refiller. A refill that finds the queue
	// full is skipped (counted as EventRefillSkipped); the key is refilled later or by a
	// foreground call. Default 1024.
	RefillQueue int

	// SyncRefill runs each background refill inside the Take that made it due, after that
	// check's answer was decided from the lease and the key's lock released, instead of on
	// a refiller goroutine (none is started; Refillers and RefillQueue are unused). That
	// check pays one call to the next store in latency. It exists for a single-threaded
	// simulator on a virtual clock (regionsim), where refills must happen at a known point
	// of the schedule for a seed to give the same run; production leaves it false.
	SyncRefill bool

	// RefillTimeout is the deadline for one background refill call. Default 100ms; it must
	// be > 0 (a refill that hangs would hold the key's single flight).
	RefillTimeout time.Duration

	// ID names this enforcer to the next store for sightings (bucket.Request.Sight): a
	// call for a key sights it at most once per SightEvery, and the store's count of the
	// distinct enforcers that sighted it within SightTTL (bucket.Result.Seen) sizes the
	// key's batches (and, through Seen, pkg/fallback's local limits) by the enforcers that
	// actually serve it, not by all N. Empty: no sightings, every key is sized by Peers.
	// At most bucket.MaxSightLen bytes.
	ID string
	// SightEvery is the least time between two sightings of one key by this enforcer.
	// Default 1s.
	SightEvery time.Duration
	// SightTTL is how long a sighting counts, and how long a count is believed after the
	// reply that carried it. At least 2 × SightEvery and LeaseTTL. Default 10s.
	SightTTL time.Duration

	// Observer, if not nil, is told about every decision and every call to the next store
	// (see Event). It is called synchronously, sometimes with a shard lock held: it must be
	// fast, safe for concurrent use, and must not call back into the Store.
	Observer Observer
}

// DefaultConfig returns the defaults described on each Config field.
func DefaultConfig() Config {
	return Config{
		Clock:         clock.Real(),
		LeaseTTL:      time.Second,
		QuietTTL:      2 * time.Minute,
		Window:        100 * time.Millisecond,
		BusyHits:      3,
		MaxKeys:       1 << 16,
		Refillers:     4,
		RefillQueue:   1024,
		RefillTimeout: 100 * time.Millisecond,
		SightEvery:    time.Second,
		SightTTL:      10 * time.Second,
	}
}

// Bounds that keep the batch arithmetic in range (rate ≤ bucket.MaxRate, so
// rate × Window fits an int64 comfortably).
const (
	maxWindow  = time.Minute
	maxLeaseTT = time.Hour
	maxKeys    = 1 << 26
)

// Validate reports the first bad field, naming it and its value.
func (c Config) Validate() error {
	switch {
	case c.Clock == nil:
		return fmt.Errorf("%w: Clock is nil", ErrConfig)
	case c.LeaseTTL <= 0 || c.LeaseTTL > maxLeaseTT:
		return fmt.Errorf("%w: LeaseTTL %v, must be in (0, %v]", ErrConfig, c.LeaseTTL, maxLeaseTT)
	case c.QuietTTL < c.LeaseTTL || c.QuietTTL > maxLeaseTT:
		return fmt.Errorf("%w: QuietTTL %v, must be in [LeaseTTL (%v), %v]", ErrConfig, c.QuietTTL, c.LeaseTTL, maxLeaseTT)
	case c.Window <= 0 || c.Window > maxWindow:
		return fmt.Errorf("%w: Window %v, must be in (0, %v]", ErrConfig, c.Window, maxWindow)
	case c.Window > c.LeaseTTL:
		return fmt.Errorf("%w: Window %v is longer than LeaseTTL %v: batches would outlive their leases", ErrConfig, c.Window, c.LeaseTTL)
	case c.BusyHits < 1:
		return fmt.Errorf("%w: BusyHits %d, must be >= 1", ErrConfig, c.BusyHits)
	case c.MaxKeys < 1 || c.MaxKeys > maxKeys:
		return fmt.Errorf("%w: MaxKeys %d, must be in [1, %d]", ErrConfig, c.MaxKeys, maxKeys)
	case c.Refillers < 1 || c.Refillers > 1024:
		return fmt.Errorf("%w: Refillers %d, must be in [1, 1024]", ErrConfig, c.Refillers)
	case c.RefillQueue < 1 || c.RefillQueue > 1<<20:
		return fmt.Errorf("%w: RefillQueue %d, must be in [1, %d]", ErrConfig, c.RefillQueue, 1<<20)
	case c.RefillTimeout <= 0:
		return fmt.Errorf("%w: RefillTimeout %v, must be > 0", ErrConfig, c.RefillTimeout)
	case len(c.ID) > bucket.MaxSightLen:
		return fmt.Errorf("%w: ID is %d bytes, more than %d", ErrConfig, len(c.ID), bucket.MaxSightLen)
	case c.ID != "" && c.SightEvery <= 0:
		return fmt.Errorf("%w: SightEvery %v, must be > 0", ErrConfig, c.SightEvery)
	case c.ID != "" && (c.SightTTL < 2*c.SightEvery || c.SightTTL < c.LeaseTTL || c.SightTTL > bucket.MaxSightTTL):
		return fmt.Errorf("%w: SightTTL %v, must be at least 2 × SightEvery (%v) and LeaseTTL (%v), at most %v",
			ErrConfig, c.SightTTL, c.SightEvery, c.LeaseTTL, bucket.MaxSightTTL)
	}
	return nil
}

// Event is something the layer did, reported to Config.Observer with a token count.
type Event uint8

// The events. The int64 passed with each is a token count where one makes sense, else 0.
const (
	EventLeaseHit      Event = iota // a check answered from leased tokens (tokens spent)
	EventRefusalHit                 // a check refused from the refusal cache (0)
	EventPaced                      // a check refused from memory: lease empty, key contended and paced (0)
	EventCall                       // a foreground call to the next store (tokens asked)
	EventCallError                  // a foreground call failed (0)
	EventRefill                     // a background refill call (tokens asked)
	EventRefillError                // a background refill failed; nobody else is told (0)
	EventRefillSkipped              // a refill was due but the queue was full (0)
	EventGranted                    // the next store granted tokens to a lease (tokens)
	EventExpired                    // leased tokens dropped unspent at LeaseTTL or QuietTTL (tokens)
	EventLimitsChanged              // a lease dropped because the request's limits changed (tokens)
	// Why a check waited on a foreground call: one of these comes with each EventCall (0).
	EventCallNew     // the key is new here, or its limits changed: nothing was known of it
	EventCallExpired // the key's leased tokens expired before it spent them
	EventCallSpent   // the key's lease ran out before a refill was due or had landed
	EventCallExact   // the key had no lease: too few checks, near its limit, or a slow limit
	EventEvicted     // a key evicted from the full table (tokens it held)
	// EventEvicted stays the last event (pkg/enforcer sizes its counters by it).
)

var eventNames = [...]string{"lease-hit", "refusal-hit", "paced", "call", "call-error", "refill",
	"refill-error", "refill-skipped", "granted", "expired", "limits-changed", "call-new", "call-expired", "call-spent", "call-exact", "evicted"}

func (e Event) String() string {
	if int(e) < len(eventNames) {
		return eventNames[e]
	}
	return "unknown"
}

// Observer receives Events; see Config.Observer for the rules it must follow.
type Observer func(ev Event, tokens int64)
