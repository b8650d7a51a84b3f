package share

import (
	"errors"
	"math"
	"strings"
	"testing"
)

func TestStep(t *testing.T) {
	for _, c := range []struct {
		name             string
		mayApply, target []float64
		next             []float64
		done             bool
	}{
		{"a decrease alone: at once", []float64{0.5, 0.5}, []float64{0.3, 0.5}, []float64{0.3, 0.5}, true},
		{"an increase into free room: at once", []float64{0.3, 0.5}, []float64{0.5, 0.5}, []float64{0.5, 0.5}, true},
		{"a swap: the decrease first", []float64{0.7, 0.3}, []float64{0.3, 0.7}, []float64{0.3, 0.3}, false},
		{"the swap once acknowledged", []float64{0.3, 0.3}, []float64{0.3, 0.7}, []float64{0.3, 0.7}, true},
		// Headroom 0.1 shared by the increases in proportion to need (0.2 and 0.3 → ×0.2).
		{"part of the increases now", []float64{0.6, 0.2, 0.1}, []float64{0.2, 0.4, 0.4}, []float64{0.2, 0.24, 0.16}, false},
		{"already there", []float64{0.2, 0.3, 0.5}, []float64{0.2, 0.3, 0.5}, []float64{0.2, 0.3, 0.5}, true},
		// Σ mayApply > 1: nothing can increase; decreases still go out.
		{"over 1 already: only decreases", []float64{0.7, 0.7, 0}, []float64{0.5, 0.2, 0.3}, []float64{0.5, 0.2, 0}, false},
		// A region missing from mayApply may be applying anything: taken as 1.
		{"an unknown region blocks increases", []float64{0.2}, []float64{0.5, 0.5}, []float64{0.2, 0.5}, false},
		{"NaN mayApply is unknown too", []float64{0.2, math.NaN()}, []float64{0.5, 0.5}, []float64{0.2, 0.5}, false},
		{"a bad target is taken as 0 (NaN, < 0) or 1", []float64{0.5, 0.5, 0}, []float64{math.NaN(), -1, 2}, []float64{0, 0, 0}, false},
		{"...and reaches it once the decreases are acknowledged", []float64{0, 0, 0}, []float64{math.NaN(), -1, 2}, []float64{0, 0, 1}, true},
		{"no regions", nil, nil, []float64{}, true},
	} {
		next, done := Step(c.mayApply, c.target)
		if !near(next, c.next) || done != c.done {
			t.Errorf("%s: Step(%v, %v) = %v, %v; want %v, %v", c.name, c.mayApply, c.target, next, done, c.next, c.done)
		}
		var may float64
		for r := range c.target {
			may += sanitizeMay(c.mayApply, r)
		}
		if s := StepSum(c.mayApply, next); may <= 1 && s > 1 {
			t.Errorf("%s: Σ max(mayApply, next) = %v > 1", c.name, s)
		}
	}
}

func TestStepChecked(t *testing.T) {
	for _, c := range []struct {
		mayApply, target []float64
		want             string
	}{
		{[]float64{0.5}, []float64{0.5, 0.5}, "mayApply has 1 regions, target 2"},
		{[]float64{0.5, math.NaN()}, []float64{0.5, 0.5}, "mayApply[1] NaN"},
		{[]float64{0.5, 0.5}, []float64{1.5, 0.5}, "target[0] 1.5"},
		{[]float64{-0.1, 0.5}, []float64{0.5, 0.5}, "mayApply[0] -0.1"},
	} {
		_, _, err := StepChecked(c.mayApply, c.target)
		if !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("StepChecked(%v, %v): %v, want ErrInput naming %q", c.mayApply, c.target, err, c.want)
		}
	}
	next, done, err := StepChecked([]float64{0.7, 0.3}, []float64{0.3, 0.7})
	if err != nil || done || !near(next, []float64{0.3, 0.3}) {
		t.Errorf("StepChecked swap: %v %v %v", next, done, err)
	}
}
