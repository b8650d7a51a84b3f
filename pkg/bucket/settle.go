package bucket

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// Costs settled after the response.
//
// A request whose cost is known only once it is served (LLM tokens, rows, bytes) is
// checked with an estimate, then settled: the difference actual − estimate is taken from
// the same buckets (or, when negative, given back to them). A take after the fact cannot
// be refused — the response has happened — so a settlement takes whatever the bucket
// holds and may leave it in debt (negative tokens): later takes are refused until the
// debt has refilled. The debt is bounded: a bucket never goes more than one burst below
// zero (Limit.Settle), so a settlement larger than that is forgiven past the bound (over,
// by what exceeds it), and one client cannot lock its key out for longer than two bursts'
// refill time. A refund never fills a bucket above its burst (under, by what would have
// gone over).
//
// A settlement of a check is one-shot: the check records a marker (Mark: the estimate
// and the rule's cost, under an id only the checker knows, with a TTL), and Settle
// deletes the marker and adjusts the buckets in one atomic step. An unknown, expired or
// already settled marker is ErrNotMarked and changes nothing, however many settlements of
// one marker arrive at once. The estimate is read from the marker, never from the caller:
// a caller can settle only what it was checked for. A settlement without a marker
// (Settlement.ID empty) applies its Delta as given: for trusted callers that carry no
// handle (Envoy's hits sent on stream done, and its negative hits).

// Bounds on marks and settlements.
const (
	// MaxMarkIDLen is the longest marker id, in bytes.
	MaxMarkIDLen = 192
	// MinMarkTTL and MaxMarkTTL bound how long a marker may wait for its settlement.
	MinMarkTTL = time.Millisecond
	MaxMarkTTL = 24 * time.Hour
	// MaxSettle is the largest amount a settlement names (Actual, |Delta|, Estimate,
	// Cost): enough for any bucket (MaxBurst), and small enough that Actual × Cost stays
	// exact in a float64 for every cost a rule may carry.
	MaxSettle = int64(MaxBurst)
)

// maxDelta bounds a marked settlement's delta (actual × cost − estimate), as the script
// does: any bucket (burst ≤ MaxBurst) ends the same past it, and it stays an exact integer.
const maxDelta = 2 * MaxBurst

// ErrNotMarked is Settle's answer when the marker of a settlement is not there: never
// recorded, expired, or settled already. Nothing was changed.
var ErrNotMarked = errors.New("bucket: settlement handle unknown, expired or already settled")

// Mark records that a check took Estimate tokens that it may settle later.
type Mark struct {
	// Identity is whose buckets the check took from; the marker lives beside them (one
	// Redis slot).
	Identity string
	// ID names the marker among the identity's, chosen by the caller (random, so only the
	// checker knows it); at most MaxMarkIDLen bytes.
	ID string
	// Estimate is the tokens the check took, in [1, MaxSettle].
	Estimate int64
	// Cost is the tokens one unit of the settled amount stands for (the rule's cost for
	// the route), in [1, MaxSettle]: Settle takes Actual × Cost − Estimate.
	Cost int64
	// TTL is how long the marker waits for its settlement, in [MinMarkTTL, MaxMarkTTL];
	// after it the estimate stands.
	TTL time.Duration
}

// Settlement adjusts an identity's buckets after the fact.
type Settlement struct {
	// Identity and Limits are the buckets, as the check's Request named them (the limits
	// as they are now: a bucket is refilled at its current rate before it is adjusted).
	Identity string
	Limits   []Limit
	// ID names the check's marker (Mark.ID). Empty: a settlement without a marker, which
	// applies Delta as given.
	ID string
	// Actual is the actual amount, with ID: the settlement takes Actual × Cost − Estimate
	// (the marker's), in [0, MaxSettle].
	Actual int64
	// Delta is the tokens to take (> 0) or give back (< 0) without ID, |Delta| ≤ MaxSettle.
	Delta int64
}

// Settled is Settle's answer.
type Settled struct {
	// Delta is the tokens taken (> 0) or given back (< 0) as asked, before the buckets'
	// bounds (debt, burst) cut it.
	Delta int64
	// Limiting is the index of the bucket with the fewest tokens after the settlement.
	Limiting int
	// Remaining is the whole tokens of that bucket after it: negative while it is in debt.
	Remaining int64
	// Source says which layer answered.
	Source Source
}

// Settler records markers and settles. Implementations are safe for concurrent use and
// validate their input (ErrInvalid) before doing anything; other errors mean the store
// could not answer and nothing is known to have changed (a lost reply may have settled:
// a retry is then ErrNotMarked, and the settlement stands once).
type Settler interface {
	// Mark records m's marker; a marker of the same id already there is kept as it was.
	Mark(ctx context.Context, m *Mark) error
	// Settle applies s in one atomic step: with s.ID, only if the marker is there, which
	// it deletes (ErrNotMarked otherwise, changing nothing).
	Settle(ctx context.Context, s *Settlement) (Settled, error)
}

// Settle returns what a bucket holding tokens (at the moment, see TokensAt) holds after
// a settlement of delta tokens: delta > 0 is taken whatever the bucket holds, down to at
// most one burst below zero (the debt bound); delta < 0 is given back, up to the burst.
// The Redis script (settle.lua) does the same operations in the same order.
func (l Limit) Settle(tokens float64, delta int64) float64 {
	t := tokens - float64(delta)
	if t > l.Burst {
		t = l.Burst
	}
	if t < -l.Burst {
		t = -l.Burst
	}
	return t
}

// settleRemaining is Settled.Remaining of a bucket holding t: whole tokens, negative in
// debt (floor, so a bucket at −0.5 says −1: it cannot grant).
func settleRemaining(t float64) int64 {
	return int64(math.Floor(t + eps))
}

// Validate checks a mark and returns an error wrapping ErrInvalid that names the field.
func (m *Mark) Validate() error {
	if err := validateSettleKey(m.Identity, m.ID, true); err != nil {
		return err
	}
	switch {
	case m.Estimate < 1 || m.Estimate > MaxSettle:
		return fmt.Errorf("%w: mark %.64q: estimate %d, must be in [1, %d]", ErrInvalid, m.ID, m.Estimate, MaxSettle)
	case m.Cost < 1 || m.Cost > MaxSettle:
		return fmt.Errorf("%w: mark %.64q: cost %d, must be in [1, %d]", ErrInvalid, m.ID, m.Cost, MaxSettle)
	case m.TTL < MinMarkTTL || m.TTL > MaxMarkTTL:
		return fmt.Errorf("%w: mark %.64q: ttl %v, must be in [%v, %v]", ErrInvalid, m.ID, m.TTL, MinMarkTTL, MaxMarkTTL)
	}
	return nil
}

// Validate checks a settlement and returns an error wrapping ErrInvalid that names the
// field.
func (s *Settlement) Validate() error {
	if err := validateSettleKey(s.Identity, s.ID, false); err != nil {
		return err
	}
	if len(s.Limits) == 0 || len(s.Limits) > MaxLimits {
		return fmt.Errorf("%w: settlement for %.64q: %d limits, must be in [1, %d]", ErrInvalid, s.Identity, len(s.Limits), MaxLimits)
	}
	if s.ID != "" && (s.Actual < 0 || s.Actual > MaxSettle) {
		return fmt.Errorf("%w: settlement for %.64q: actual %d, must be in [0, %d]", ErrInvalid, s.Identity, s.Actual, MaxSettle)
	}
	if s.ID == "" && (s.Delta < -MaxSettle || s.Delta > MaxSettle) {
		return fmt.Errorf("%w: settlement for %.64q: delta %d, must be in [-%d, %d]", ErrInvalid, s.Identity, s.Delta, MaxSettle, MaxSettle)
	}
	for i, l := range s.Limits {
		if err := l.validate(); err != nil {
			return fmt.Errorf("%w: limit %d %q: %v", ErrInvalid, i, l.Name, err)
		}
		for _, o := range s.Limits[:i] {
			if o.Name == l.Name {
				return fmt.Errorf("%w: limit name %q appears twice", ErrInvalid, l.Name)
			}
		}
	}
	return nil
}

func validateSettleKey(identity, id string, needID bool) error {
	switch {
	case identity == "":
		return fmt.Errorf("%w: empty identity", ErrInvalid)
	case len(identity) > MaxIdentityLen:
		return fmt.Errorf("%w: identity is %d bytes, more than %d", ErrInvalid, len(identity), MaxIdentityLen)
	case needID && id == "":
		return fmt.Errorf("%w: identity %.64q: empty mark id", ErrInvalid, identity)
	case len(id) > MaxMarkIDLen:
		return fmt.Errorf("%w: identity %.64q: mark id is %d bytes, more than %d", ErrInvalid, identity, len(id), MaxMarkIDLen)
	}
	return nil
}
