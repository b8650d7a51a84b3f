// Package bucket holds allot's token-bucket math and the Store contract that every layer
// (memory, Redis, leases, fallback) implements.
//
// The math is pure: time is passed in as Unix microseconds, nothing sleeps, nothing ticks.
// A bucket is (tokens, last); refill is lazy:
//
//	tokens(now) = min(burst, tokens + (now - last) × rate)
//
// A bucket never seen before, or one idle long enough to be full again, holds burst tokens,
// so a store may forget a bucket once it would be full (expiry) without changing any answer.
//
// Guarantee: over any window of length T a bucket admits at most burst + rate × T tokens,
// and a caller that asks steadily is refused only when that bound would be passed.
package bucket

import "math"

// Limit is the shape of one token bucket: it refills at Rate tokens a second up to Burst.
type Limit struct {
	// Name tells the buckets of one identity apart (e.g. "per-second", "rule7/minute").
	Name string
	// Rate is the refill rate in tokens per second; finite and > 0.
	Rate float64
	// Burst is the capacity in tokens; finite and >= 1.
	Burst float64
}

// State is a bucket at a moment: Tokens held at Last (Unix microseconds). The zero State
// is a bucket never seen, which is full.
type State struct {
	Tokens float64
	Last   int64
}

// eps absorbs float rounding when turning tokens into whole grants: 2.9999999999 tokens
// that are really 3 must grant 3. It errs over by at most 1e-9 of a token per take.
const eps = 1e-9

// TokensAt returns the tokens the bucket holds at now (Unix µs). A clock that goes
// backwards refills nothing; it never takes tokens away.
func (l Limit) TokensAt(s State, now int64) float64 {
	if s.Last == 0 {
		return l.Burst
	}
	elapsed := now - s.Last
	if elapsed < 0 {
		elapsed = 0
	}
	t := s.Tokens + float64(elapsed)*l.Rate/1e6
	if t > l.Burst {
		t = l.Burst
	}
	return t
}

// MaxWaitMicros caps every wait the math reports (about 31.7 years). Validation allows any
// rate > 0, and without a cap a tiny rate would overflow int64 (and time.Duration) into a
// negative retry-after.
const MaxWaitMicros = 1e15

// MicrosUntil returns how many microseconds (rounded up) until the bucket holding tokens
// holds need tokens; 0 if it already does; at most MaxWaitMicros.
func (l Limit) MicrosUntil(tokens, need float64) int64 {
	if tokens+eps >= need {
		return 0
	}
	w := math.Ceil((need - tokens) * 1e6 / l.Rate)
	if w > MaxWaitMicros {
		return MaxWaitMicros
	}
	return int64(w)
}

// Decision is the outcome of one take over several buckets.
type Decision struct {
	// Granted is the number of tokens taken from every bucket: 0 (refused) or in [min, want].
	Granted int64
	// Limiting is the index of the bucket that bounds the answer: the one that refused
	// (longest wait) or, when granted, the one with the fewest tokens left.
	Limiting int
	// Remaining is the whole tokens left in the limiting bucket after the take.
	Remaining int64
	// RetryAfterMicros, when refused, is how long until min tokens can be taken from
	// every bucket. 0 when granted.
	RetryAfterMicros int64
	// ResetMicros is how long until the limiting bucket is full again.
	ResetMicros int64
}

// Decide takes between min and want tokens from every bucket at once, all or nothing.
// tokens[i] holds bucket i's tokens at the moment of the decision (see TokensAt) and is
// updated in place to what is left. It grants the largest amount g with min <= g <= want
// that every bucket holds; if some bucket holds fewer than min whole tokens it grants
// nothing, leaves every bucket as it was and says how long until min would be available.
//
// Decide does not validate its input; Request.Validate does that before a store calls it.
func Decide(limits []Limit, tokens []float64, want, min int64) Decision {
	avail := want
	for i := range limits {
		a := int64(math.Floor(tokens[i] + eps))
		if a < avail {
			avail = a
		}
	}
	if avail < min {
		d := Decision{}
		for i, l := range limits {
			w := l.MicrosUntil(tokens[i], float64(min))
			if w > d.RetryAfterMicros || i == 0 {
				d.RetryAfterMicros, d.Limiting = w, i
			}
		}
		li := limits[d.Limiting]
		d.Remaining = wholeTokens(tokens[d.Limiting])
		d.ResetMicros = li.MicrosUntil(tokens[d.Limiting], li.Burst)
		return d
	}
	d := Decision{Granted: avail}
	best := math.Inf(1)
	for i := range limits {
		tokens[i] -= float64(avail)
		if tokens[i] < best {
			best, d.Limiting = tokens[i], i
		}
	}
	li := limits[d.Limiting]
	d.Remaining = wholeTokens(tokens[d.Limiting])
	d.ResetMicros = li.MicrosUntil(tokens[d.Limiting], li.Burst)
	return d
}

func wholeTokens(t float64) int64 {
	w := int64(math.Floor(t + eps))
	if w < 0 {
		return 0
	}
	return w
}

// FullAfterMicros is how long a bucket left holding tokens takes to be full again: the
// longest a store must remember it (its expiry). Always >= 1.
func (l Limit) FullAfterMicros(tokens float64) int64 {
	m := l.MicrosUntil(tokens, l.Burst)
	if m < 1 {
		m = 1
	}
	return m
}
