package fallback_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/fallback"
)

// deadRedis stands for a Redis shard that stopped answering.
type deadRedis struct{}

func (deadRedis) Take(context.Context, *bucket.Request) (bucket.Result, error) {
	return bucket.Result{}, errors.New("dial tcp 127.0.0.1:7000: connection refused")
}

func Example() {
	clk := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	cfg := fallback.DefaultConfig()
	cfg.Clock = clk
	cfg.TripAfter = 2
	cfg.Peers = func() int { return 4 } // 4 enforcers in the region
	s, err := fallback.New(deadRedis{}, cfg)
	if err != nil {
		panic(err)
	}
	defer s.Close()

	// 10 a second, bursts of 20: locally 20 × Slack 2 / 4 enforcers = 10 tokens.
	search := &bucket.Request{Identity: "key:abc", Want: 1,
		Limits: []bucket.Limit{{Name: "per-second", Rate: 10, Burst: 20}}}
	login := &bucket.Request{Identity: "key:abc/login", Want: 1, FailClosed: true,
		Limits: []bucket.Limit{{Name: "per-minute", Rate: 0.1, Burst: 5}}}

	admitted := 0
	for i := 0; i < 15; i++ {
		res, _ := s.Take(context.Background(), search)
		admitted += int(res.Granted)
	}
	res, err := s.Take(context.Background(), search)
	fmt.Println("breaker:", s.State(""), "| search from", res.Source, "| admitted 10 of 15 first:", admitted == 10)
	// A fail-closed request is not answered locally: the caller refuses it.
	res, err = s.Take(context.Background(), login)
	fmt.Println("login:", err, "| retry after", res.RetryAfter)
	// Output:
	// breaker: open | search from fallback | admitted 10 of 15 first: true
	// login: bucket: store unavailable | retry after 250ms
}
