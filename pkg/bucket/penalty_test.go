package bucket_test

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
)

// TestPenaltyAddSteps walks Penalty.Add on a fake timeline (µs): the window fills, the
// block holds, refusals while blocked are not counted, and a new window starts after it.
func TestPenaltyAddSteps(t *testing.T) {
	p := &bucket.Penalty{Name: "r", Refusals: 5, Within: time.Minute, Block: 10 * time.Minute}
	const s, m = int64(1e6), int64(60e6)
	t0 := int64(1_000) * s
	var st bucket.PenaltyState
	steps := []struct {
		at      int64
		n       int64
		want    bucket.PenaltyState
		blocked bool
	}{
		{t0, 0, bucket.PenaltyState{}, false},                                                                            // nothing counted
		{t0, 2, bucket.PenaltyState{Count: 2, Start: t0}, false},                                                         // a window starts
		{t0 + 30*s, 2, bucket.PenaltyState{Count: 4, Start: t0}, false},                                                  // same window
		{t0 + m, 1, bucket.PenaltyState{Count: 1, Start: t0 + m}, false},                                                 // the window ended: a new one
		{t0 + m + s, 3, bucket.PenaltyState{Count: 4, Start: t0 + m}, false},                                             // 4 of 5
		{t0 + m + 2*s, 1, bucket.PenaltyState{Count: 5, Start: t0 + m, Until: t0 + m + 2*s + 10*m}, true},                // the fifth blocks
		{t0 + 5*m, 100, bucket.PenaltyState{Count: 5, Start: t0 + m, Until: t0 + m + 2*s + 10*m}, true},                  // blocked: not counted
		{t0 + 11*m + 2*s, 1, bucket.PenaltyState{Count: 1, Start: t0 + 11*m + 2*s}, false},                               // after: a new window
		{t0 + 11*m + 3*s, 4, bucket.PenaltyState{Count: 5, Start: t0 + 11*m + 2*s, Until: t0 + 11*m + 3*s + 10*m}, true}, // blocked again
	}
	for i, step := range steps {
		st = p.Add(st, step.at, step.n)
		if st != step.want || st.Blocked(step.at) != step.blocked {
			t.Fatalf("step %d (at %d µs, %d refusals): state %+v blocked %v, want %+v blocked %v", i, step.at, step.n, st, st.Blocked(step.at), step.want, step.blocked)
		}
	}
	// A block shorter than the window: after it the count starts over, it does not carry
	// the count that blocked into a second block at once.
	q := &bucket.Penalty{Name: "q", Refusals: 3, Within: time.Hour, Block: time.Second}
	st = q.Add(bucket.PenaltyState{}, t0, 3)
	if !st.Blocked(t0) {
		t.Fatalf("3 of 3 did not block: %+v", st)
	}
	st = q.Add(st, t0+2*s, 1)
	if st.Blocked(t0+2*s) || st.Count != 1 {
		t.Fatalf("one refusal after a short block: %+v, want a new window of 1", st)
	}
}

// The memory store: a refused identity is counted, refusals handed over (Request.Refused)
// count too, the block refuses whatever the buckets hold, and ends on time.
func TestMemoryPenalty(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	m := bucket.NewMemory(clk, 0)
	p := &bucket.Penalty{Name: "abuse", Refusals: 10, Within: time.Minute, Block: 5 * time.Minute}
	req := func(refused int64) *bucket.Request {
		return &bucket.Request{Identity: "key:a", Limits: []bucket.Limit{{Name: "abuse/s", Rate: 1, Burst: 1}}, Want: 1, Penalty: p, Refused: refused}
	}
	ctx := context.Background()
	take := func(refused int64) bucket.Result {
		t.Helper()
		res, err := m.Take(ctx, req(refused))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := take(0); !res.Allowed() || res.PenaltyCount != 0 {
		t.Fatalf("first take: %+v", res)
	}
	if res := take(0); res.Allowed() || res.Penalized || res.PenaltyCount != 1 {
		t.Fatalf("second take: %+v, want refused and counted once", res)
	}
	if res := take(7); res.Allowed() || res.Penalized || res.PenaltyCount != 9 {
		t.Fatalf("take with 7 handed over: %+v, want refused, 9 counted", res)
	}
	res := take(0)
	if !res.Penalized || res.RetryAfter != 5*time.Minute || res.PenaltyCount != 10 {
		t.Fatalf("the tenth refusal: %+v, want penalized for 5m", res)
	}
	clk.Advance(2 * time.Minute) // the bucket is full again, the block holds
	if res := take(0); !res.Penalized || res.RetryAfter != 3*time.Minute {
		t.Fatalf("during the block: %+v, want penalized 3m more", res)
	}
	if st, now, err := m.PeekPenalty(ctx, "key:a", p); err != nil || !st.Blocked(now) || st.Count != 10 {
		t.Fatalf("PeekPenalty: %+v at %d, %v", st, now, err)
	}
	clk.Advance(3 * time.Minute)
	if res := take(0); !res.Allowed() {
		t.Fatalf("after the block: %+v, want allowed", res)
	}
	// A request without a penalty for the same identity is never blocked by it.
	if _, err := m.Take(ctx, &bucket.Request{Identity: "key:a", Limits: []bucket.Limit{{Name: "other", Rate: 1, Burst: 1}}, Want: 1}); err != nil {
		t.Fatal(err)
	}
	// Bad input is refused by name.
	for _, r := range []*bucket.Request{
		{Identity: "k", Limits: req(0).Limits, Want: 1, Refused: 3},
		{Identity: "k", Limits: req(0).Limits, Want: 1, Penalty: p, Refused: -1},
		{Identity: "k", Limits: req(0).Limits, Want: 1, Penalty: &bucket.Penalty{Name: "x", Refusals: 0, Within: time.Minute, Block: time.Minute}},
	} {
		if _, err := m.Take(ctx, r); err == nil {
			t.Errorf("accepted %+v", r)
		}
	}
}
