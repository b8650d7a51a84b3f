package envoyrl

// The model a file loads into: Config, Descriptor, RateLimit and Unit, and the Error
// every problem is reported as.

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrInvalid is wrapped by every error Parse, LoadDir and LoadDirMerged report.
var ErrInvalid = errors.New("invalid envoyproxy/ratelimit configuration")

// Error is one problem of a file, at a line (0 when the line is unknown).
type Error struct {
	File string
	Line int
	Msg  string
}

func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.File, e.Msg)
}

// Is makes errors.Is(err, ErrInvalid) hold.
func (e *Error) Is(target error) bool { return target == ErrInvalid }

// Config is one file: one domain and its descriptor tree.
type Config struct {
	Domain      string
	Descriptors []Descriptor
	// File is the name the file was parsed under (for a merged domain, the first file).
	File string
	// Line is the line of the domain key (0 when absent).
	Line int
	// Warnings name what envoyproxy/ratelimit accepts but ignores, "file:line: ...".
	Warnings []string
}

// Descriptor is one entry of a descriptors list.
type Descriptor struct {
	Key string
	// Value is optional; empty matches any value of Key.
	Value     string
	RateLimit *RateLimit
	// Descriptors are the nested entries.
	Descriptors    []Descriptor
	ShadowMode     bool
	QuotaMode      bool
	DetailedMetric bool
	ValueToMetric  bool
	ShareThreshold bool
	// Metadata is arbitrary; envoyproxy/ratelimit returns it with the descriptor's status.
	Metadata map[string]any
	File     string
	Line     int
}

// CompositeKey is the key envoyproxy/ratelimit files a descriptor under at its level:
// key, or key_value when a value is given. Two entries of one level must differ in it.
func (d *Descriptor) CompositeKey() string {
	if d.Value == "" {
		return d.Key
	}
	return d.Key + "_" + d.Value
}

// RateLimit is a descriptor's rate_limit block.
type RateLimit struct {
	// Unit is UnitUnknown when Unlimited.
	Unit            Unit
	RequestsPerUnit uint32
	Unlimited       bool
	Name            string
	Replaces        []string
	Line            int
}

// Unit is a rate_limit unit; the values are those of envoy's RateLimitResponse.RateLimit.Unit.
type Unit int

const (
	UnitUnknown Unit = 0
	UnitSecond  Unit = 1
	UnitMinute  Unit = 2
	UnitHour    Unit = 3
	UnitDay     Unit = 4
	UnitMonth   Unit = 5
	UnitYear    Unit = 6
	UnitWeek    Unit = 7
)

var unitNames = map[string]Unit{
	"second": UnitSecond, "minute": UnitMinute, "hour": UnitHour, "day": UnitDay,
	"week": UnitWeek, "month": UnitMonth, "year": UnitYear,
}

// ParseUnit reads a unit as envoyproxy/ratelimit does: case-insensitively, one of
// second, minute, hour, day, week, month, year.
func ParseUnit(s string) (Unit, bool) {
	u, ok := unitNames[strings.ToLower(s)]
	return u, ok
}

func (u Unit) String() string {
	for n, v := range unitNames {
		if v == u {
			return n
		}
	}
	return "unknown"
}

// Duration is the unit's length as envoyproxy/ratelimit counts it (a month is 30 days, a
// year 365); 0 for UnitUnknown.
func (u Unit) Duration() time.Duration {
	const day = 24 * time.Hour
	switch u {
	case UnitSecond:
		return time.Second
	case UnitMinute:
		return time.Minute
	case UnitHour:
		return time.Hour
	case UnitDay:
		return day
	case UnitWeek:
		return 7 * day
	case UnitMonth:
		return 30 * day
	case UnitYear:
		return 365 * day
	}
	return 0
}
