package bucket_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/redis/go-redis/v9"
)

// The fenced enforcers' marks count the distinct ids marked within the window, forget the
// older ones, are bounded, list the newest with their seqs, say how long ago another
// enforcer was heard, and refuse a bad id or window with an error naming it: the same in
// memory and in Redis (fence.lua).
func runFences(t *testing.T, f bucket.Fences, clk *clock.Fake) {
	t.Helper()
	ctx := context.Background()
	ttl := 30 * time.Second
	call := func(c bucket.FenceCall) bucket.FenceReply {
		t.Helper()
		c.TTL = ttl
		if c.HeardAgo == 0 {
			c.HeardAgo = -1
		}
		r, err := f.Fence(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	mark := func(id string, fenced bool, want int) {
		t.Helper()
		if r := call(bucket.FenceCall{ID: id, Fenced: fenced, Seq: 7}); r.Marked != want || len(r.Marks) != min(want, bucket.MaxFenceMarks) {
			t.Fatalf("Fence(%q, %v) = %d marked, %d listed; want %d", id, fenced, r.Marked, len(r.Marks), want)
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

	// Each mark keeps the seq it was made with (the last one), newest first.
	clk.Advance(time.Second)
	call(bucket.FenceCall{ID: "eu-west-6", Fenced: true, Seq: 41})
	clk.Advance(time.Second)
	call(bucket.FenceCall{ID: "eu-west-6", Fenced: true, Seq: 42})
	r := call(bucket.FenceCall{})
	want := []bucket.FenceMark{{ID: "eu-west-6", Seq: 42}, {ID: "eu-west-3", Seq: 7}}
	if r.Marked != 2 || !slices.Equal(r.Marks, want) {
		t.Fatalf("marks %d %v, want 2 %v", r.Marked, r.Marks, want)
	}
	mark("eu-west-6", false, 1)
	call(bucket.FenceCall{ID: "eu-west-6", Fenced: true}) // marked again, with no seq
	if r := call(bucket.FenceCall{}); len(r.Marks) != 2 || r.Marks[0] != (bucket.FenceMark{ID: "eu-west-6"}) {
		t.Fatalf("marks %v, want eu-west-6 with seq 0 first", r.Marks)
	}

	// Heard times: the latest of the others, within twice the marks' window (behind an
	// aggregator a heard time is up to two intervals old when recorded).
	clk.Advance(time.Minute)
	if r := call(bucket.FenceCall{ID: "a", HeardAgo: 2 * time.Second}); r.MateHeardAgo >= 0 {
		t.Fatalf("alone: mate heard %v ago, want none", r.MateHeardAgo)
	}
	call(bucket.FenceCall{ID: "b", HeardAgo: 5 * time.Second})
	clk.Advance(time.Second)
	if r := call(bucket.FenceCall{ID: "c", HeardAgo: 70 * time.Second}); r.MateHeardAgo != 3*time.Second { // a's, not c's (older than the heard window)
		t.Fatalf("mate heard %v ago, want 3s (a's)", r.MateHeardAgo)
	}
	if r := call(bucket.FenceCall{ID: "a", HeardAgo: -1}); r.MateHeardAgo != 6*time.Second { // b's: a's own is not a mate's
		t.Fatalf("a: mate heard %v ago, want 6s (b's)", r.MateHeardAgo)
	}
	clk.Advance(30 * time.Second)
	if r := call(bucket.FenceCall{ID: "c", HeardAgo: -1}); r.MateHeardAgo != 33*time.Second {
		t.Fatalf("past the marks' window: mate heard %v ago, want 33s (a's)", r.MateHeardAgo)
	}
	clk.Advance(30 * time.Second)
	if r := call(bucket.FenceCall{ID: "c", HeardAgo: -1}); r.MateHeardAgo >= 0 {
		t.Fatalf("after the heard window: mate heard %v ago, want none", r.MateHeardAgo)
	}

	clk.Advance(time.Minute)
	for i := range bucket.MaxFences + 10 {
		if _, err := f.Fence(ctx, bucket.FenceCall{ID: fmt.Sprintf("e%d", i), Fenced: true, TTL: ttl, HeardAgo: -1}); err != nil {
			t.Fatal(err)
		}
	}
	count("", bucket.MaxFences)
	for _, bad := range []struct {
		id   string
		ttl  time.Duration
		name string
	}{{strings.Repeat("x", bucket.MaxSightLen+1), ttl, "fence id"}, {"a", 0, "fence ttl"}, {"a", 2 * time.Hour, "fence ttl"}} {
		_, err := f.Fence(ctx, bucket.FenceCall{ID: bad.id, Fenced: true, TTL: bad.ttl})
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
