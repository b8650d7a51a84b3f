package share_test

import (
	"fmt"
	"math"

	"github.com/allot-dev/allot/pkg/share"
)

// The package doc's worked example: one identity limited to 1000/s globally, default
// split (0.5, 0.3, 0.2), over five intervals; its traffic moves to region 2 in the fourth.
// Headroom 0, so that the slack is handed out by the default split alone (the doc says
// what the default Headroom changes).
func Example() {
	cfg := share.DefaultConfig()
	cfg.Headroom = 0
	nan := math.NaN()
	var st share.State
	for i, demand := range [][]float64{
		{500, 300, 100},
		{560, 280, 60},
		{540, 290, 70}, // a wobble inside the dead-band
		{0, 100, 1200}, // the traffic moves to region 2
		{0, 100, 1200},
	} {
		in := share.Input{Limit: 1000, Demand: demand, Default: []float64{0.5, 0.3, 0.2}, Held: []float64{nan, nan, nan}}
		next, err := share.AllocateChecked(cfg, st, in)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("interval %d: demand %v smoothed %.0f shares %.3f\n", i+1, demand, next.Smoothed, next.Shares)
		st = next
	}
	// Output:
	// interval 1: demand [500 300 100] smoothed [500 300 100] shares [0.550 0.330 0.120]
	// interval 2: demand [560 280 60] smoothed [530 290 80] shares [0.580 0.320 0.100]
	// interval 3: demand [540 290 70] smoothed [535 290 75] shares [0.580 0.320 0.100]
	// interval 4: demand [0 100 1200] smoothed [0 100 1200] shares [0.010 0.100 0.890]
	// interval 5: demand [0 100 1200] smoothed [0 100 1200] shares [0.010 0.100 0.890]
}

// The change plan from the worked example's interval 3 to its interval 4: the decreases
// are published first; the increase once they are acknowledged.
func ExampleStep() {
	applied := []float64{0.58, 0.32, 0.10}
	target := []float64{0.01, 0.1, 0.89}
	mayApply := applied
	for step := 1; ; step++ {
		next, done := share.Step(mayApply, target)
		worst := 0.0 // what the regions enforce at most while next is being applied
		for r := range next {
			worst += max(mayApply[r], next[r])
		}
		fmt.Printf("step %d: publish %.2f (at most %.2f enforced) done %v\n", step, next, worst, done)
		if done {
			break
		}
		mayApply = next // every region acknowledged it
	}
	// Output:
	// step 1: publish [0.01 0.10 0.10] (at most 1.00 enforced) done false
	// step 2: publish [0.01 0.10 0.89] (at most 1.00 enforced) done true
}

// A silent region (not heard, Held at its last share) keeps its share; the others get no
// more than what it leaves.
func ExampleAllocate_silentRegion() {
	cfg := share.DefaultConfig()
	nan := math.NaN()
	st := share.Allocate(cfg, share.State{}, share.Input{
		Limit: 1000, Demand: []float64{500, 500, 0},
		Default: []float64{0.5, 0.3, 0.2}, Held: []float64{nan, nan, nan},
	})
	fmt.Printf("both heard: %.3f\n", st.Shares)
	st = share.Allocate(cfg, st, share.Input{
		Limit: 1000, Demand: []float64{900, nan, 0},
		Default: []float64{0.5, 0.3, 0.2}, Held: []float64{nan, st.Shares[1], nan},
	})
	fmt.Printf("region 1 silent, held: %.3f\n", st.Shares)
	// Output:
	// both heard: [0.495 0.495 0.010]
	// region 1 silent, held: [0.495 0.495 0.010]
}
