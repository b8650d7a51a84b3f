package bucket_test

import (
	"context"
	"fmt"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
)

// A token bucket of 2 a second with bursts of 3, in the exact in-memory store on a fake
// clock: the burst passes at once, the next take is refused with the wait until a token
// is back, and after that wait (the clock advanced by hand, nothing sleeps) it passes.
func ExampleMemory() {
	clk := clock.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	store := bucket.NewMemory(clk, 0)
	req := &bucket.Request{
		Identity: "key:abc",
		Limits:   []bucket.Limit{{Name: "per-second", Rate: 2, Burst: 3}},
		Want:     1,
	}
	take := func() {
		res, err := store.Take(context.Background(), req)
		if err != nil {
			panic(err)
		}
		if res.Allowed() {
			fmt.Printf("allowed, %d left\n", res.Remaining)
		} else {
			fmt.Printf("refused, retry after %v\n", res.RetryAfter)
		}
	}
	for range 4 {
		take()
	}
	clk.Advance(500 * time.Millisecond)
	take()
	// Output:
	// allowed, 2 left
	// allowed, 1 left
	// allowed, 0 left
	// refused, retry after 500ms
	// allowed, 0 left
}

// One take covers every limit of a request at once, all or nothing: the second take,
// refused by the per-second limit, takes nothing from the per-minute one, which is why
// the third passes; the fourth is refused by the per-minute limit.
func ExampleMemory_severalLimits() {
	clk := clock.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	store := bucket.NewMemory(clk, 0)
	req := &bucket.Request{
		Identity: "key:abc",
		Limits: []bucket.Limit{
			{Name: "per-second", Rate: 1, Burst: 1},
			{Name: "per-minute", Rate: 1.0 / 60, Burst: 2},
		},
		Want: 1,
	}
	for _, wait := range []time.Duration{0, 0, time.Second, time.Second} {
		clk.Advance(wait)
		res, err := store.Take(context.Background(), req)
		if err != nil {
			panic(err)
		}
		name := req.Limits[res.Limiting].Name
		if res.Allowed() {
			fmt.Printf("allowed, %s has %d left\n", name, res.Remaining)
		} else {
			fmt.Printf("refused by %s, retry after %v\n", name, res.RetryAfter.Round(time.Second))
		}
	}
	// Output:
	// allowed, per-second has 0 left
	// refused by per-second, retry after 1s
	// allowed, per-second has 0 left
	// refused by per-minute, retry after 58s
}
