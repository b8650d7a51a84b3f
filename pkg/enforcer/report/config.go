package report

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/allot-dev/allot/pkg/rules"
)

// ErrConfig is wrapped by every error Config.Validate and ReporterConfig.Validate return.
var ErrConfig = errors.New("usage: invalid config")

// Config sizes a Table. Start from DefaultConfig and change what you need; the zero
// Config is not valid (NewTable rejects it with an error naming the field).
type Config struct {
	// Capacity is how many (rule, identity) pairs the table tracks at once, over all
	// stripes: the memory bound. Each pair of Capacity costs about 460 B of heap when the
	// table is full of short identities (two tables, the interval being filled and the
	// spare it drains into, plus last interval's refusals for the early test): about
	// 7.6 MB at the default. Must be a multiple of Stripes. Default 16384.
	Capacity int

	// Stripes is the number of independently locked parts of the table, a power of two;
	// a pair lives in the stripe its identity hashes to. More stripes, less contention;
	// but each stripe is its own Space-Saving table of Capacity/Stripes pairs, so the
	// error bound is per stripe (see the package doc). Default 16.
	Stripes int

	// Interval is the reporting interval the early-report test scales by (the Reporter
	// reports every Interval). Default 10s.
	Interval time.Duration

	// MaxIdentities caps the identities in one report: pressured ones first, then the
	// busiest by volume; the rest are counted in omitted_identities/omitted_tokens.
	// Default 4096.
	MaxIdentities int

	// PressureFraction: an identity is under pressure when it was refused anything, or
	// admitted more than PressureFraction × RegionalRate × the interval's length. In
	// (0, 1]. Default 0.5.
	PressureFraction float64

	// RegionalRate returns the tokens/s this region allows the identity at now (the rule's
	// first limit after this region's share). Called only by Report, once per tracked pair
	// with the report's time (one clock read a report, not one a pair), never on the check
	// path; it must be safe for concurrent use. nil means rule.Limits[0].Rate (the compiled
	// regional rate).
	RegionalRate func(rule *rules.Compiled, identity string, now time.Time) float64

	// EarlyGap is the least time between two reports that WantEarly allows. Default 1s.
	EarlyGap time.Duration

	// EarlyMinRefused and EarlyFactor define a jump in refusals: an identity's refused
	// tokens this interval exceed both EarlyMinRefused and EarlyFactor × its refused
	// tokens last interval (scaled to a whole Interval). Defaults 100 and 2.
	EarlyMinRefused int64
	EarlyFactor     float64
}

// DefaultConfig returns the defaults described on each Config field.
func DefaultConfig() Config {
	return Config{
		Capacity:         1 << 14,
		Stripes:          16,
		Interval:         10 * time.Second,
		MaxIdentities:    4096,
		PressureFraction: 0.5,
		EarlyGap:         time.Second,
		EarlyMinRefused:  100,
		EarlyFactor:      2,
	}
}

const (
	maxCapacity = 1 << 24
	maxStripes  = 1 << 10
)

// Validate reports the first bad field, naming it and its value.
func (c Config) Validate() error {
	switch {
	case c.Stripes < 1 || c.Stripes > maxStripes || c.Stripes&(c.Stripes-1) != 0:
		return fmt.Errorf("%w: Stripes %d, must be a power of two in [1, %d]", ErrConfig, c.Stripes, maxStripes)
	case c.Capacity < c.Stripes || c.Capacity > maxCapacity || c.Capacity%c.Stripes != 0:
		return fmt.Errorf("%w: Capacity %d, must be a multiple of Stripes (%d) in [%d, %d]", ErrConfig, c.Capacity, c.Stripes, c.Stripes, maxCapacity)
	case c.Interval <= 0:
		return fmt.Errorf("%w: Interval %v, must be > 0", ErrConfig, c.Interval)
	case c.MaxIdentities < 1:
		return fmt.Errorf("%w: MaxIdentities %d, must be >= 1", ErrConfig, c.MaxIdentities)
	case !(c.PressureFraction > 0 && c.PressureFraction <= 1):
		return fmt.Errorf("%w: PressureFraction %v, must be in (0, 1]", ErrConfig, c.PressureFraction)
	case c.EarlyGap <= 0 || c.EarlyGap > c.Interval:
		return fmt.Errorf("%w: EarlyGap %v, must be in (0, Interval %v]", ErrConfig, c.EarlyGap, c.Interval)
	case c.EarlyMinRefused < 1:
		return fmt.Errorf("%w: EarlyMinRefused %d, must be >= 1", ErrConfig, c.EarlyMinRefused)
	case !(c.EarlyFactor >= 1) || math.IsInf(c.EarlyFactor, 1):
		return fmt.Errorf("%w: EarlyFactor %v, must be finite and >= 1", ErrConfig, c.EarlyFactor)
	}
	return nil
}

// defaultRegionalRate is the compiled regional rate of the rule's first limit.
func defaultRegionalRate(rule *rules.Compiled, _ string, _ time.Time) float64 {
	if rule == nil || len(rule.Limits) == 0 {
		return 0
	}
	return rule.Limits[0].Rate
}
