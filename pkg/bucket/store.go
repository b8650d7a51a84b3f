package bucket

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// Bounds on what a Request may carry. They keep bad or hostile input away from Redis.
const (
	// MaxLimits is the most buckets one request may take from at once.
	MaxLimits = 8
	// MaxIdentityLen is the longest identity, in bytes.
	MaxIdentityLen = 512
	// MaxNameLen is the longest bucket name, in bytes.
	MaxNameLen = 128
	// MaxRate is the highest refill rate, tokens per second.
	MaxRate = 1e9
	// MaxBurst is the largest capacity, in tokens.
	MaxBurst = 1e12
)

// ErrInvalid is wrapped by every validation error: the request never reached a store.
var ErrInvalid = errors.New("bucket: invalid request")

// ErrUnavailable is returned by a layer that cannot reach the store for a request it must
// not answer itself (Request.FailClosed; pkg/fallback while a shard is unavailable).
// Nothing was taken. The Result returned with it is not an answer: its Source is
// SourceFailClosed and its RetryAfter, when > 0, is when the store will next be tried. The
// caller applies the fail mode (pkg/enforcer, the one place that decides it).
var ErrUnavailable = errors.New("bucket: store unavailable")

// Source says where an answer came from, for responses, metrics and decision logs. It is
// the one Source of the check path: the stores and the layers above them (pkg/lease,
// pkg/fallback) stamp theirs on a Result, the enforcer stamps its own (none, fail-open,
// too-large, shadow) on a Decision, and the front ends map it to their wire forms in one
// place each (pkg/enforcer/grpcapi for allot.v1.Source). The zero value is SourceNone: no
// store answered. Values are small and dense (NumSources bounds them) so that per-source
// counters are an array.
type Source uint8

// The sources of an answer.
const (
	SourceNone         Source = iota // no store answered (the enforcer: no enforcing rule applied)
	SourceMemory                     // the in-memory store
	SourceRedis                      // one script on the key's Redis shard
	SourceLease                      // tokens leased earlier and spent from memory
	SourceRefusalCache               // refused from memory until a retry time the store gave
	SourceFallback                   // local degraded limits while Redis is unavailable
	SourceFailClosed                 // refused: the store is unavailable and the rule fails closed
	SourceFailOpen                   // allowed: the store failed and the rule fails open
	SourceTooLarge                   // refused: the request costs more than the rule's burst
	SourceShadow                     // a shadow rule's evaluation (decision logs only)
	NumSources                       // one past the last Source
)

var sourceNames = [NumSources]string{"none", "memory", "redis", "lease", "refusal-cache", "fallback", "fail-closed", "fail-open", "too-large", "shadow"}

// String is the source's name as metrics, logs and the HTTP API spell it; "unknown" for
// a value past the last source.
func (s Source) String() string {
	if s < NumSources {
		return sourceNames[s]
	}
	return "unknown"
}

// Request asks a Store to take tokens from every bucket of one identity at once.
type Request struct {
	// Identity names whose buckets these are ("key:abc", "ip:2001:db8::/64"). All buckets of
	// one identity live together (one Redis slot), so one atomic step sees them all.
	Identity string
	// Limits are the buckets to take from; names are unique within the request.
	Limits []Limit
	// Want is the most tokens to take (request cost, or a lease batch); >= 1.
	Want int64
	// Min is the fewest tokens worth taking; 0 means Want (all or nothing). A request of
	// cost c sets Min = Want = c; a lease asks for a batch with Min = the cost.
	Min int64
	// FailClosed asks layers that answer while the store is unavailable (pkg/fallback) not
	// to enforce local limits but to return ErrUnavailable, so that the caller refuses: for
	// security rules (login, OTP) an outage must not become a brute-force window. Stores
	// themselves ignore it.
	FailClosed bool
	// Sight, when not empty, records in the same atomic step that the taker it names (an
	// enforcer's instance id, at most MaxSightLen bytes) serves this identity, and asks
	// how many distinct takers did so within the last SightTTL (Result.Seen). It is
	// recorded whether or not tokens are granted. Layers above the store send it about
	// once a second per identity, not per request (pkg/lease).
	Sight string
	// SightTTL is how long a sighting counts, in [MinSightTTL, MaxSightTTL]; used only
	// with Sight.
	SightTTL time.Duration
	// Penalty, when not nil, is the rule's penalty for abuse (see Penalty): the store
	// refuses the identity outright while it is blocked (Result.Penalized), and otherwise
	// counts this take's refusal, if it refuses, and Refused more toward it. Nil costs a
	// store nothing.
	Penalty *Penalty
	// Refused is how many refusals a layer above answered from memory for this identity
	// since its last call (pkg/lease), counted toward Penalty; in [0, MaxPenaltyRefusals],
	// and 0 without a Penalty.
	Refused int64
}

// Sightings: the bounds of Request.Sight and Request.SightTTL, and the most distinct
// takers a store remembers per identity (past it the oldest sightings are dropped, so
// Result.Seen is at most MaxSightings).
const (
	MaxSightLen  = 64
	MinSightTTL  = time.Millisecond
	MaxSightTTL  = time.Hour
	MaxSightings = 1024
)

// MinGrant returns the effective minimum grant.
func (r *Request) MinGrant() int64 {
	if r.Min <= 0 {
		return r.Want
	}
	return r.Min
}

// Result is a Store's answer. It holds no slices, so returning it allocates nothing.
type Result struct {
	// Granted is how many tokens were taken: 0 means refused.
	Granted int64
	// Limiting is the index in Request.Limits of the bucket that decided (see Decision).
	Limiting int
	// Remaining is the whole tokens left in the limiting bucket.
	Remaining int64
	// RetryAfter, when refused, is the wait until Min tokens can be taken.
	RetryAfter time.Duration
	// Reset is the wait until the limiting bucket is full again.
	Reset time.Duration
	// Source says which layer answered.
	Source Source
	// Seen, for a request with Sight, is how many distinct takers sighted the identity
	// within its SightTTL, this one included; 0 when the request asked nothing or the
	// layer that answered does not know (pkg/fallback's local answers).
	Seen int
	// Penalized says the identity is refused outright by Request.Penalty until
	// RetryAfter from now (Granted is 0; Limiting, Remaining and Reset are zero).
	Penalized bool
	// PenaltyCount is, for a request with a Penalty, the refusals counted in its current
	// window (the count that blocked it, when Penalized).
	PenaltyCount int64
}

// Allowed reports whether any tokens were granted.
func (r Result) Allowed() bool { return r.Granted > 0 }

// ResultOf turns a Decision into a Result from source.
func ResultOf(d Decision, source Source) Result {
	return Result{
		Granted:    d.Granted,
		Limiting:   d.Limiting,
		Remaining:  d.Remaining,
		RetryAfter: time.Duration(d.RetryAfterMicros) * time.Microsecond,
		Reset:      time.Duration(d.ResetMicros) * time.Microsecond,
		Source:     source,
	}
}

// Store takes tokens. Implementations are safe for concurrent use. Take validates the
// request (ErrInvalid) before doing anything; other errors mean the store could not
// answer (e.g. Redis unreachable) and nothing is known to have been taken.
type Store interface {
	Take(ctx context.Context, req *Request) (Result, error)
}

// ValidTaker is a Store that can take for a request its caller has already validated
// (Request.Validate returned nil and the request has not changed since), skipping the
// validation its Take would repeat. The check path validates once, at its outermost layer
// (pkg/fallback's Take), and each layer passes the request down with TakeValid: a request
// with up to MaxLimits limits costs one Validate instead of one per layer. TakeValid of an
// invalid request is undefined (it may panic or take wrongly); Take stays the safe entry.
type ValidTaker interface {
	TakeValid(ctx context.Context, req *Request) (Result, error)
}

// Validated returns next's TakeValid when next is a ValidTaker, else its Take: resolved once
// by a layer when it is built, so the check path makes no type assertion.
func Validated(next Store) func(ctx context.Context, req *Request) (Result, error) {
	if v, ok := next.(ValidTaker); ok {
		return v.TakeValid
	}
	return next.Take
}

// Validate checks a request against the bounds above and returns an error wrapping
// ErrInvalid that names the field and value at fault.
func (r *Request) Validate() error {
	if r.Identity == "" {
		return fmt.Errorf("%w: empty identity", ErrInvalid)
	}
	if len(r.Identity) > MaxIdentityLen {
		return fmt.Errorf("%w: identity is %d bytes, more than %d", ErrInvalid, len(r.Identity), MaxIdentityLen)
	}
	if len(r.Limits) == 0 {
		return fmt.Errorf("%w: identity %.64q: no limits", ErrInvalid, r.Identity)
	}
	if len(r.Limits) > MaxLimits {
		return fmt.Errorf("%w: identity %.64q: %d limits, more than %d", ErrInvalid, r.Identity, len(r.Limits), MaxLimits)
	}
	if r.Want < 1 {
		return fmt.Errorf("%w: want %d, must be >= 1", ErrInvalid, r.Want)
	}
	if r.Min < 0 || r.Min > r.Want {
		return fmt.Errorf("%w: min %d, must be in [0, want=%d]", ErrInvalid, r.Min, r.Want)
	}
	if r.Sight != "" && (len(r.Sight) > MaxSightLen || r.SightTTL < MinSightTTL || r.SightTTL > MaxSightTTL) {
		return fmt.Errorf("%w: sight %.64q (%d bytes, at most %d) for %v (in [%v, %v])", ErrInvalid, r.Sight, len(r.Sight), MaxSightLen, r.SightTTL, MinSightTTL, MaxSightTTL)
	}
	if r.Penalty != nil {
		if err := r.Penalty.validate(); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalid, err)
		}
	}
	if r.Refused < 0 || r.Refused > MaxPenaltyRefusals || (r.Refused > 0 && r.Penalty == nil) {
		return fmt.Errorf("%w: refused %d, must be in [0, %d], and 0 without a penalty", ErrInvalid, r.Refused, MaxPenaltyRefusals)
	}
	for i, l := range r.Limits {
		if err := l.validate(); err != nil {
			return fmt.Errorf("%w: limit %d %q: %v", ErrInvalid, i, l.Name, err)
		}
		if float64(r.Want) > l.Burst {
			return fmt.Errorf("%w: limit %q: want %d is above burst %g and could never be granted", ErrInvalid, l.Name, r.Want, l.Burst)
		}
		for _, o := range r.Limits[:i] {
			if o.Name == l.Name {
				return fmt.Errorf("%w: limit name %q appears twice", ErrInvalid, l.Name)
			}
		}
	}
	return nil
}

func (l Limit) validate() error {
	switch {
	case l.Name == "":
		return errors.New("empty name")
	case len(l.Name) > MaxNameLen:
		return fmt.Errorf("name is %d bytes, more than %d", len(l.Name), MaxNameLen)
	case math.IsNaN(l.Rate) || math.IsInf(l.Rate, 0) || l.Rate <= 0:
		return fmt.Errorf("rate %g, must be finite and > 0", l.Rate)
	case l.Rate > MaxRate:
		return fmt.Errorf("rate %g, more than %g", l.Rate, float64(MaxRate))
	case math.IsNaN(l.Burst) || math.IsInf(l.Burst, 0) || l.Burst < 1:
		return fmt.Errorf("burst %g, must be finite and >= 1", l.Burst)
	case l.Burst > MaxBurst:
		return fmt.Errorf("burst %g, more than %g", l.Burst, float64(MaxBurst))
	}
	return nil
}
