package lease_test

import (
	"context"
	"fmt"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/lease"
)

// A lease layer over a store (bucket.Memory here; bucket.NewRedis in an enforcer). The
// first checks of a key are exact calls; once the key is busy (3 checks in a window) it
// takes a batch and spends it from memory.
func Example() {
	clk := clock.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	cfg := lease.DefaultConfig()
	cfg.Clock = clk
	cfg.Peers = func() int { return 3 } // enforcers in the region
	s, err := lease.New(bucket.NewMemory(clk, 0), cfg)
	if err != nil {
		panic(err)
	}
	defer s.Close()

	req := &bucket.Request{
		Identity: "key:abc",
		Limits:   []bucket.Limit{{Name: "per-second", Rate: 1000, Burst: 2000}},
		Want:     1,
	}
	for i := range 6 {
		res, err := s.Take(context.Background(), req)
		if err != nil {
			panic(err)
		}
		fmt.Println(i+1, res.Granted, res.Source)
	}
	// Output:
	// 1 1 memory
	// 2 1 memory
	// 3 1 memory
	// 4 1 lease
	// 5 1 lease
	// 6 1 lease
}
