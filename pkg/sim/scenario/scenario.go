// Package scenario is regionsim's scenario format: what traffic each key offers in each
// region over time, which faults happen when, and what the run is expected to show.
//
// The format is fixed (scenarios written elsewhere are run against it unchanged):
//
//	name: shift-eu-to-us
//	duration: 180s
//	seed: 7
//	interval: 10s              # balancer interval (default 10s)
//	propagation: 500ms         # publish → applied delay, virtual mode (default 500ms)
//	regions:
//	  us-east:  {enforcers: 3}
//	  eu-west:  {enforcers: 3}
//	keys:
//	  - name: acme
//	    limit: {rate: 1000, per: 1s, burst: 2000}
//	    phases:                # offered requests/s per region from `at` on
//	      - {at: 0s,  offered: {eu-west: 1500}}
//	      - {at: 60s, offered: {us-east: 1500}}
//	faults:                    # optional
//	  - {at: 30s, for: 20s, kind: redis-down, region: eu-west}
//	  - {at: 40s, for: 90s, kind: enforcer-isolated, region: eu-west, enforcer: 1}
//	expect:                    # optional; these are the defaults
//	  max_window_ratio: 1.01
//	  steady_ratio: 0.97
//	  recovery_s: 15
//
// Parsing is strict: an unknown field, a value of the wrong type, a bad duration or a
// region that is not declared is an error naming the file, the line and the field, and
// the whole scenario is rejected (errors.Is(err, ErrInvalid)).
package scenario

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// ErrInvalid is wrapped by every error Parse returns.
var ErrInvalid = errors.New("scenario: invalid")

// Defaults of the optional fields.
const (
	DefaultInterval       = 10 * time.Second
	DefaultPropagation    = 500 * time.Millisecond
	DefaultSeed           = 1
	DefaultMaxWindowRatio = 1.01
	DefaultSteadyRatio    = 0.97
	DefaultRecoveryS      = 15.0
)

// Bounds that keep a scenario runnable.
const (
	MaxDuration  = 24 * time.Hour
	MaxEnforcers = 1000
	MaxKeys      = 10000
	MaxRegions   = 64
	MaxRate      = 1e9 // requests per second, offered or limited
)

// Fault kinds. Each lasts from at for `for`; region names the region where one is needed.
const (
	RedisDown      = "redis-down"      // the region's bucket store fails every call
	BalancerDown   = "balancer-down"   // the control plane neither hears reports nor publishes
	RegionIsolated = "region-isolated" // the region's reports and share updates are cut
	// EnforcerIsolated cuts one enforcer of the region (enforcer: its index, from 0;
	// default 0) off the control plane: its reports and share updates are lost while it
	// keeps serving its gateways from its region's store, and its region-mates report.
	EnforcerIsolated = "enforcer-isolated"
	// LeaderChange: the balancer leader dies at `at` and a new one is elected `for` later,
	// restoring the set the old one last wrote (as balancer-down does when it ends).
	LeaderChange = "leader-change"
	// RegionRestart: every enforcer of the region restarts at `at` (new processes: new
	// ids, empty usage tables, no share set) and cannot reach the control plane (etcd, the
	// balancer) until at + for, when it reads the set in force and reports again.
	RegionRestart = "region-restart"
)

// Scenario is a parsed, validated scenario. Plain data; Parse returns a new one.
type Scenario struct {
	Name        string
	Duration    time.Duration
	Seed        int64
	Interval    time.Duration
	Propagation time.Duration
	// Regions in the order the file lists them; that order is the balancer's region order.
	Regions []Region
	Keys    []Key
	Faults  []Fault
	Expect  Expect
}

// Region is one region and how many enforcers serve it.
type Region struct {
	Name      string
	Enforcers int
}

// Key is one API key: its global limit and the traffic it offers.
type Key struct {
	Name  string
	Limit Limit
	// Phases in increasing At; before the first one the key offers nothing.
	Phases []Phase
}

// Limit is Rate tokens per Per, holding up to Burst.
type Limit struct {
	Rate  float64
	Per   time.Duration
	Burst float64
}

// PerSecond is the limit's rate in tokens per second.
func (l Limit) PerSecond() float64 { return l.Rate / l.Per.Seconds() }

// Phase is the offered traffic (requests per second, by region index) from At on.
type Phase struct {
	At time.Duration
	// Offered is indexed like Scenario.Regions; a region not named offers 0.
	Offered []float64
}

// Regions is how many regions the phase offers traffic in.
func (p Phase) Regions() int {
	n := 0
	for _, o := range p.Offered {
		if o > 0 {
			n++
		}
	}
	return n
}

// Fault is one fault from At for For. Region is the region's index, or -1 for
// balancer-down and leader-change; Enforcer is the enforcer's index within it for
// enforcer-isolated (0 otherwise).
type Fault struct {
	At       time.Duration
	For      time.Duration
	Kind     string
	Region   int
	Enforcer int
}

// End is when the fault is over.
func (f Fault) End() time.Duration { return f.At + f.For }

// Expect are the figures a run must meet.
type Expect struct {
	MaxWindowRatio float64
	SteadyRatio    float64
	RecoveryS      float64
}

// RegionIndex returns the index of the region named name, or -1.
func (s *Scenario) RegionIndex(name string) int {
	for i, r := range s.Regions {
		if r.Name == name {
			return i
		}
	}
	return -1
}

// OfferedAt returns the requests per second key k offers in region r at t.
func (k *Key) OfferedAt(r int, t time.Duration) float64 {
	v := 0.0
	for _, p := range k.Phases {
		if p.At > t {
			break
		}
		v = p.Offered[r]
	}
	return v
}

// Error is one problem in a scenario file. It wraps ErrInvalid; its message reads
//
//	shift.yaml:14: keys[0].limit.rate: -1, must be finite and > 0
type Error struct {
	File  string
	Line  int
	Field string
	Msg   string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("scenario: ")
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
		}
		b.WriteString(": ")
	} else if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap lets errors.Is(err, ErrInvalid) see every scenario error.
func (e *Error) Unwrap() error { return ErrInvalid }

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }
