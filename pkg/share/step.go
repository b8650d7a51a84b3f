package share

import (
	"fmt"
	"math"
)

// stepMargin is taken off a partial increase so that rounding cannot push
// Σ max(mayApply, next) over 1; it is far below anything a bucket can tell apart.
const stepMargin = 1e-12

// Step is one step of a change plan: given what each region may be applying now
// (mayApply[r]: the highest share among the versions region r has not yet acknowledged
// replacing — its last acknowledged one and any published since) and the target, it
// returns the shares to publish next. Increases wait until the decreases they need are
// acknowledged: for every r, Σ_q max(mayApply[q], next[q]) ≤ 1, so any mix of old and new
// versions applied across regions sums to ≤ 1. done reports next == target.
//
// Decreases are taken at once (next[r] = target[r] when target[r] ≤ mayApply[r]). The
// increases share the headroom 1 − Σ mayApply in proportion to what each still needs;
// when the headroom covers them all, next = target. So a target summing to ≤ 1 is reached
// in at most two steps: the one that publishes the decreases, and the one after every
// decreasing region acknowledged them. The protocol the caller must follow is in the
// package doc (# Change plan).
//
// Step does not fail: a mayApply that is missing (shorter slice), NaN or above 1 is taken
// as 1 (unknown: the region may be applying anything, so nothing increases against it), a
// negative one as 0; a target that is NaN or negative is taken as 0, one above 1 as 1. StepChecked
// reports such input instead. If Σ mayApply > 1 already, no step can make the sum ≤ 1:
// next then only decreases relative to mayApply — which, for a region at 1, lets any share
// through. A caller that knows the published shares holds each at most there while
// StepSum(mayApply, next) > 1 (pkg/balancer's plan.step).
func Step(mayApply, target []float64) (next []float64, done bool) {
	return StepInto(nil, mayApply, target)
}

// StepChecked is Step after checking that mayApply and target have the same length and
// every value is in [0, 1]; the error wraps ErrInput and names the field and value.
func StepChecked(mayApply, target []float64) (next []float64, done bool, err error) {
	if len(mayApply) != len(target) {
		return nil, false, fmt.Errorf("%w: mayApply has %d regions, target %d", ErrInput, len(mayApply), len(target))
	}
	for r := range target {
		if v := mayApply[r]; !(v >= 0 && v <= 1) {
			return nil, false, fmt.Errorf("%w: mayApply[%d] %v, must be in [0, 1]", ErrInput, r, v)
		}
		if v := target[r]; !(v >= 0 && v <= 1) {
			return nil, false, fmt.Errorf("%w: target[%d] %v, must be in [0, 1]", ErrInput, r, v)
		}
	}
	next, done = Step(mayApply, target)
	return next, done, nil
}

// StepInto is Step writing next into dst when it has the capacity (no allocation then).
// dst must not share memory with mayApply or target.
func StepInto(dst, mayApply, target []float64) (next []float64, done bool) {
	n := len(target)
	next = dst[:0]
	var base, need float64 // Σ mayApply; Σ of the increases still to make
	for r := 0; r < n; r++ {
		m, t := sanitizeMay(mayApply, r), sanitizeTarget(target[r])
		next = append(next, min(m, t)) // decreases at once, increases held at m
		base += m
		if t > m {
			need += t - m
		}
	}
	if need > 0 {
		// All of the target if it fits against what may still be applied.
		var all float64
		for r := 0; r < n; r++ {
			all += max(sanitizeMay(mayApply, r), sanitizeTarget(target[r]))
		}
		if all <= 1 {
			for r := 0; r < n; r++ {
				next[r] = sanitizeTarget(target[r])
			}
		} else if headroom := 1 - base; headroom > 0 {
			// Part of each increase, the same fraction for all.
			f := headroom / need * (1 - stepMargin)
			for r := 0; r < n; r++ {
				m, t := sanitizeMay(mayApply, r), sanitizeTarget(target[r])
				if t > m {
					next[r] = min(m+(t-m)*f, t)
				}
			}
			if StepSum(mayApply, next) > 1 { // rounding beyond the margin: give up the increases
				for r := 0; r < n; r++ {
					next[r] = min(sanitizeMay(mayApply, r), sanitizeTarget(target[r]))
				}
			}
		}
	}
	done = true
	for r := 0; r < n; r++ {
		if next[r] != sanitizeTarget(target[r]) {
			done = false
			break
		}
	}
	return next, done
}

// StepSum is Σ_q max(mayApply[q], next[q]), the most the regions can be enforcing while
// next is being applied (a missing, NaN or out-of-range mayApply taken as Step takes it).
func StepSum(mayApply, next []float64) float64 {
	var s float64
	for r := range next {
		s += max(sanitizeMay(mayApply, r), next[r])
	}
	return s
}

func sanitizeMay(mayApply []float64, r int) float64 {
	if r >= len(mayApply) {
		return 1
	}
	v := mayApply[r]
	switch {
	case math.IsNaN(v) || v > 1:
		return 1
	case v < 0:
		return 0
	}
	return v
}

func sanitizeTarget(v float64) float64 {
	switch {
	case !(v >= 0): // NaN or negative
		return 0
	case v > 1:
		return 1
	}
	return v
}
