package lease_test

import (
	"context"
	"fmt"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/lease"
)

// A lease layer over a store (bucket.Memory here; bucket.NewRedis in an enforcer). A
// key's first check calls the store for an opening lot of two checks' tokens, so its
// second is answered from memory; the third, with the lot spent and the key's demand not
// yet known, calls again; once the key is busy (3 checks in a window) that call takes a
// batch, and the checks after it are spent from memory.
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
	// 2 1 lease
	// 3 1 memory
	// 4 1 lease
	// 5 1 lease
	// 6 1 lease
}
