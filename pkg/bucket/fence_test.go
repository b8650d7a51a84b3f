package bucket_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/redis/go-redis/v9"
)

// The fenced enforcers' marks count the distinct ids marked within the window, forget the
// older ones, are bounded, and refuse a bad id or window with an error naming it: the same
// in memory and in Redis (fence.lua).
func runFences(t *testing.T, f bucket.Fences, clk *clock.Fake) {
	t.Helper()
	ctx := context.Background()
	ttl := 30 * time.Second
	mark := func(id string, fenced bool, want int) {
		t.Helper()
		n, err := f.Fence(ctx, id, fenced, ttl)
		if err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Fatalf("Fence(%q, %v) = %d, want %d", id, fenced, n, want)
		}
	}
	count := func(id string, want int) { t.Helper(); mark(id, id != "", want) }
	count("", 0)
	count("eu-west-0", 1)
	count("eu-west-0", 1) // the same enforcer again
	clk.Advance(20 * time.Second)
	count("eu-west-2", 2)
	count("", 2)
	clk.Advance(15 * time.Second) // eu-west-0's mark is 35 s old
	count("", 1)
	clk.Advance(20 * time.Second)
	count("", 0) // a crashed enforcer stops marking: forgotten after the window
	count("eu-west-1", 1)
	count("eu-west-3", 2)
	mark("eu-west-1", false, 1) // heard again: it takes its mark back
	mark("eu-west-5", false, 1) // one that never marked takes back nothing
	clk.Advance(time.Minute)
	for i := range bucket.MaxFences + 10 {
		if _, err := f.Fence(ctx, fmt.Sprintf("e%d", i), true, ttl); err != nil {
			t.Fatal(err)
		}
	}
	count("", bucket.MaxFences)
	for _, bad := range []struct {
		id   string
		ttl  time.Duration
		name string
	}{{strings.Repeat("x", bucket.MaxSightLen+1), ttl, "fence id"}, {"a", 0, "fence ttl"}, {"a", 2 * time.Hour, "fence ttl"}} {
		_, err := f.Fence(ctx, bad.id, true, bad.ttl)
		if !errors.Is(err, bucket.ErrInvalid) || !strings.Contains(err.Error(), bad.name) {
			t.Fatalf("Fence(%.10q, %v): %v, want ErrInvalid naming %s", bad.id, bad.ttl, err, bad.name)
		}
	}
}

func TestFencesMemory(t *testing.T) {
	fc := clock.NewFake(t0)
	runFences(t, bucket.NewMemory(fc, 0), fc)
}

func TestFencesRedis(t *testing.T) {
	n := testenv.Redis(t)
	c := redis.NewClient(&redis.Options{Addr: n.Addr})
	t.Cleanup(func() { _ = c.Close() })
	fc := clock.NewFake(t0)
	st, err := bucket.NewRedis(c, bucket.RedisOptions{Clock: fc, KeyPrefix: "fence-test:"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	runFences(t, st, fc)
	// The marks are one key, expiring a window after the newest mark.
	ttl, err := c.PTTL(context.Background(), st.FenceKey()).Result()
	if err != nil || ttl <= 0 || ttl > 30*time.Second {
		t.Fatalf("PTTL %s = %v, %v; want in (0, 30s]", st.FenceKey(), ttl, err)
	}
}
