package grpcapi

// A descriptor's own limit (RateLimitDescriptor.limit), honoured with
// Config.LimitOverrides: the rule it stands for, compiled once per (requests_per_unit,
// unit) and kept.

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/rules"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// maxOverrides bounds the override rules a Server keeps; past it an override is compiled
// for its request alone (slower, never refused).
const maxOverrides = 1024

// overrides keeps the compiled rule of each (requests_per_unit, unit) seen. Safe for
// concurrent use; its zero value is empty and ready.
type overrides struct {
	m sync.Map     // uint64(unit)<<32 | rpu → *rules.Compiled
	n atomic.Int64 // entries in m
}

// rule returns the rule for descriptor i's override o: a token bucket of burst
// requests_per_unit refilled at requests_per_unit per unit, counted by descriptor
// (requests_per_unit 0: every request refused, as with them). A unit that is none is
// InvalidArgument naming the descriptor.
func (ov *overrides) rule(i int, o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) (*rules.Compiled, error) {
	unit := rlsv3.RateLimitResponse_RateLimit_Unit(o.GetUnit())
	secs := unitSeconds(unit)
	if secs == 0 {
		return nil, fmt.Errorf("%w: descriptor %d: limit override unit %d is not a unit (want SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR)", enforcer.ErrInvalid, i, int32(o.GetUnit()))
	}
	k := uint64(unit)<<32 | uint64(o.GetRequestsPerUnit())
	if r, ok := ov.m.Load(k); ok {
		return r.(*rules.Compiled), nil
	}
	r, err := compileOverride(o.GetRequestsPerUnit(), unit, time.Duration(secs)*time.Second)
	if err != nil {
		return nil, fmt.Errorf("%w: descriptor %d: limit override: %v", enforcer.ErrInvalid, i, err)
	}
	if ov.n.Load() < maxOverrides {
		if got, loaded := ov.m.LoadOrStore(k, r); loaded {
			return got.(*rules.Compiled), nil
		}
		ov.n.Add(1)
	}
	return r, nil
}

// compileOverride compiles the rule of an override of rpu requests per unit (per long).
// Its id, "override.<unit>.<rpu>", names it in statuses and header fields.
func compileOverride(rpu uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit, per time.Duration) (*rules.Compiled, error) {
	name := strings.ToLower(unit.String())
	r := rules.Rule{
		ID: fmt.Sprintf("override.%s.%d", name, rpu),
		// The match is never walked (enforcer.Request.Override is taken as it is); it
		// makes the rule one counted by descriptor.
		Match:  rules.Match{Domain: "envoy-limit-override", Descriptor: []rules.DescriptorEntry{{Key: "limit"}}},
		By:     rules.ByDescriptor,
		Reason: "the descriptor's limit override (Envoy RLS)",
	}
	if rpu == 0 {
		r.Refuse = true
	} else {
		r.Limits = []rules.LimitSpec{{Name: name, Rate: float64(rpu), Per: per, Burst: float64(rpu)}}
	}
	snap, err := rules.Compile(&rules.Set{Rules: []rules.Rule{r}}, rules.CompileOptions{})
	if err != nil {
		return nil, err
	}
	return snap.Rules()[0], nil
}
