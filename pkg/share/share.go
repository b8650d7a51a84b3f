package share

import (
	"errors"
	"fmt"
	"math"
)

// ErrConfig is wrapped by every error Config.Validate returns.
var ErrConfig = errors.New("share: invalid config")

// ErrInput is wrapped by every error AllocateChecked and StepChecked return for bad input.
var ErrInput = errors.New("share: invalid input")

// Config is the policy's configuration. The zero value is not valid: start from
// DefaultConfig. A Config is a plain value, safe to share between goroutines.
type Config struct {
	// Floor is the share each free region keeps in reserve so that traffic appearing
	// there is served at once, up to Floor × limit, while the balancer catches up. It is
	// kept when floors fit (Floor × free regions ≤ 1 − Σ Held); otherwise every free
	// region gets an equal floor of what is left. Two idle regions at Floor cost a busy
	// one 2 × Floor of the limit for as long as they stay idle. In [0, 1); at most
	// 1/regions (checked by AllocateChecked). Default 0.01.
	Floor float64
	// Alpha is the EWMA weight of the newest interval's demand, in (0, 1]; 1 is no
	// smoothing. It applies while no region is short (package doc, step 1: when one is,
	// the newest demand is taken whatever Alpha is). Default 0.5.
	Alpha float64
	// DeadBand: a target whose every region moved less than this (absolute share) from
	// the previous shares is not a change (the previous shares stand), unless a region
	// that wants more than it has would gain at least DeadBand/4. It is also the margin
	// by which a region's demand must exceed its share to count as short, and 1/4 of it
	// the least a collapse must release (package doc, step 1). In [0, 1). Default 0.02.
	DeadBand float64
	// Headroom is how many standard deviations of a second's Poisson arrivals (√demand
	// tokens/s) the slack tops each region up by before the rest goes by the default
	// split (package doc, step 4): a bucket whose rate barely covers a key's average
	// refuses its bursts, and a small key used from one region got two thirds of its
	// limit's slack elsewhere. 0 is none. In [0, 10]. Default 2.
	Headroom float64
}

// DefaultConfig returns the defaults above. Why these values is in the package doc.
func DefaultConfig() Config { return Config{Floor: 0.01, Alpha: 0.5, DeadBand: 0.02, Headroom: 2} }

// Validate reports the first bad field, naming it and its value. NaN is never valid.
func (c Config) Validate() error {
	switch {
	case !(c.Floor >= 0 && c.Floor < 1):
		return fmt.Errorf("%w: Floor %v, must be in [0, 1)", ErrConfig, c.Floor)
	case !(c.Alpha > 0 && c.Alpha <= 1):
		return fmt.Errorf("%w: Alpha %v, must be in (0, 1]", ErrConfig, c.Alpha)
	case !(c.DeadBand >= 0 && c.DeadBand < 1):
		return fmt.Errorf("%w: DeadBand %v, must be in [0, 1)", ErrConfig, c.DeadBand)
	case !(c.Headroom >= 0 && c.Headroom <= 10):
		return fmt.Errorf("%w: Headroom %v, must be in [0, 10]", ErrConfig, c.Headroom)
	}
	return nil
}

// clamped is the Config Allocate uses when it was not validated: each field forced into
// its range (NaN Floor, DeadBand and Headroom to 0, a bad Alpha to 1, i.e. no smoothing).
func (c Config) clamped() Config {
	if !(c.Floor >= 0) {
		c.Floor = 0
	}
	c.Floor = min(c.Floor, 1)
	if !(c.Alpha > 0 && c.Alpha <= 1) {
		c.Alpha = 1
	}
	if !(c.DeadBand >= 0) {
		c.DeadBand = 0
	}
	c.DeadBand = min(c.DeadBand, 1)
	if !(c.Headroom >= 0) {
		c.Headroom = 0
	}
	c.Headroom = min(c.Headroom, 10)
	return c
}

// State is what the balancer keeps per identity between intervals. The zero value is an
// identity never seen: Allocate starts it from the default split (as if the enforcers
// applied Input.Default, which is what they do for an identity never published). A State
// is a plain value; Allocate never modifies the State it is given (AllocateInto writes
// only into its dst, which may be the same State).
type State struct {
	// Smoothed is the smoothed demand per region, tokens/s (index = region); nil before
	// the first Allocate. Kept in tokens/s, not as a fraction, so a changed limit does
	// not distort it.
	Smoothed []float64
	// Shares is the target last computed (after the dead-band); nil before.
	Shares []float64
	// Var is the variance of each Smoothed demand as an estimate, tokens²/s² (from
	// Input.Noise, carried through the smoothing: see the package doc, # Noise); nil
	// before the first Allocate or when no Noise was ever given.
	Var []float64
	// Settling counts the allocations after a fast path (a move) that follow the demand
	// without the noise band (see AllocateInto): the move's first demand was one second's
	// reading, and the refinements that read longer stretches are the move's, not noise.
	Settling int
	// Basis is the smoothed demand Shares were last computed from (set when they change);
	// nil before. A small key's shares are held by the noise band until a smoothed demand
	// drifts more than DriftSigmas of its standard deviations from it (see AllocateInto).
	Basis []float64
}

// Input is one identity's reports for one interval. Every slice is indexed by region and
// has the same length.
type Input struct {
	// Limit is the global rate, tokens/s (> 0).
	Limit float64
	// Demand is this interval's demand per region, tokens/s (admitted + refused, the
	// report's lower bound). NaN: the region was not heard from at all this interval (its
	// smoothed demand is kept as it was). A region that reported but did not list the
	// identity must be given 0, not NaN: reports list the busiest and the pressured
	// identities, so an absent one wants little, and a NaN there would pin the demand of
	// a region the traffic has left (a shift would then only ever get half way).
	Demand []float64
	// Default is the identity's default split (sums to ≤ 1). It is the starting point of
	// a fresh State and the allocation when no region has any demand.
	Default []float64
	// Held: NaN for a region the policy may move; otherwise the share that region must be
	// assumed to enforce whatever is computed (a silent region: its last share, or after
	// the staleness period min(last, default)). Held regions get exactly Held; the others
	// share 1 − Σ Held. Held = 0 keeps a region at zero (no floor).
	Held []float64
	// Noise, if not nil, is the standard deviation of each region's Demand as an estimate
	// (tokens/s; for Poisson arrivals counted over T seconds, √(tokens)/T), so that noise is
	// not taken for a move: the fast path needs the demand to have moved from its smoothed
	// value by more than three standard deviations of the difference (beyond the
	// dead-band), and the dead-band widens to three standard deviations of the smoothed
	// demands of the regions whose claim is met (see the package doc, # Noise). nil or
	// NaN: 0.
	Noise []float64
	// Weight, if not nil, is each region's EWMA weight for this Demand in place of Alpha:
	// WindowWeight(Alpha, x) for a window x intervals long (a recompute 2.5 s into a 10 s
	// interval: x = 0.25), so that the smoothing's time constant is in seconds, not in
	// recomputes. nil, NaN or outside (0, 1]: Alpha. Without it a balancer recomputing
	// every few seconds (a population of thousands of keys always has one that moved)
	// averaged a few seconds of counts, and the noise band of so short an average held
	// a key off its split for 18 s.
	Weight []float64
	// Fast takes the fast path whatever the noise: the caller knows the traffic moved
	// (the balancer's shift detection) and Demand is the rate since it did.
	Fast bool
}

// check reports the first problem with in (and st) for cfg, naming the field and value.
func (in Input) check(cfg Config, st State) error {
	n := len(in.Demand)
	switch {
	case n == 0:
		return fmt.Errorf("%w: Demand is empty: no regions", ErrInput)
	case len(in.Default) != n:
		return fmt.Errorf("%w: Default has %d regions, Demand %d", ErrInput, len(in.Default), n)
	case len(in.Held) != n:
		return fmt.Errorf("%w: Held has %d regions, Demand %d", ErrInput, len(in.Held), n)
	case len(st.Smoothed) != 0 && len(st.Smoothed) != n:
		return fmt.Errorf("%w: State.Smoothed has %d regions, Demand %d", ErrInput, len(st.Smoothed), n)
	case len(st.Shares) != 0 && len(st.Shares) != n:
		return fmt.Errorf("%w: State.Shares has %d regions, Demand %d", ErrInput, len(st.Shares), n)
	case !(in.Limit > 0) || math.IsInf(in.Limit, 1):
		return fmt.Errorf("%w: Limit %v, must be finite and > 0", ErrInput, in.Limit)
	case cfg.Floor*float64(n) > 1:
		return fmt.Errorf("%w: Floor %v × %d regions = %v > 1: floors cannot fit", ErrInput, cfg.Floor, n, cfg.Floor*float64(n))
	}
	var def, held float64
	for r := 0; r < n; r++ {
		if d := in.Demand[r]; d < 0 || math.IsInf(d, 0) {
			return fmt.Errorf("%w: Demand[%d] %v, must be NaN (not heard) or finite and >= 0", ErrInput, r, d)
		}
		if d := in.Default[r]; !(d >= 0 && d <= 1) {
			return fmt.Errorf("%w: Default[%d] %v, must be in [0, 1]", ErrInput, r, d)
		}
		def += in.Default[r]
		if h := in.Held[r]; !math.IsNaN(h) {
			if !(h >= 0 && h <= 1) {
				return fmt.Errorf("%w: Held[%d] %v, must be NaN (free) or in [0, 1]", ErrInput, r, h)
			}
			held += h
		}
		if len(st.Smoothed) == n {
			if s := st.Smoothed[r]; !(s >= 0) || math.IsInf(s, 1) {
				return fmt.Errorf("%w: State.Smoothed[%d] %v, must be finite and >= 0", ErrInput, r, s)
			}
		}
		if len(st.Shares) == n {
			if s := st.Shares[r]; !(s >= 0 && s <= 1) {
				return fmt.Errorf("%w: State.Shares[%d] %v, must be in [0, 1]", ErrInput, r, s)
			}
		}
	}
	// A little tolerance: a split written as thirds sums to 1 + 1 ulp.
	if def > 1+1e-9 {
		return fmt.Errorf("%w: Default sums to %v, must be <= 1", ErrInput, def)
	}
	if held > 1+1e-9 {
		return fmt.Errorf("%w: Held sums to %v, must be <= 1", ErrInput, held)
	}
	return nil
}

// WindowWeight is the EWMA weight of a window x intervals long when a whole interval
// weighs alpha: 1 − (1 − alpha)^x, x capped at 3 (x ≤ 0 or NaN: alpha). Steps of
// WindowWeight(alpha, 1/k) k times smooth a constant demand exactly as one step of alpha.
func WindowWeight(alpha, x float64) float64 {
	if !(x > 0) || x == 1 {
		return alpha
	}
	return 1 - math.Pow(1-alpha, min(x, 3))
}
