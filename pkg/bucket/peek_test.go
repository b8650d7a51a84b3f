package bucket_test

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/testenv"
)

var peekLimits = []bucket.Limit{{Name: "second", Rate: 10, Burst: 20}, {Name: "minute", Rate: 1, Burst: 100}}

// testPeek: a bucket never seen reads full; after a take of 5 it reads what the take left
// (the minute bucket's Remaining), refilled by the time that passed, and peeking twice
// takes nothing.
func testPeek(t *testing.T, st bucket.Store, p bucket.Peeker, advance func(time.Duration)) {
	ctx := context.Background()
	got, err := p.Peek(ctx, "key:peek", peekLimits, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != 20 || got[1] != 100 {
		t.Fatalf("unseen buckets read %v, want [20 100]", got)
	}
	res, err := st.Take(ctx, &bucket.Request{Identity: "key:peek", Limits: peekLimits, Want: 5})
	if err != nil || !res.Allowed() {
		t.Fatalf("take: %+v %v", res, err)
	}
	if advance != nil {
		advance(100 * time.Millisecond)
	}
	for range 2 {
		got, err = p.Peek(ctx, "key:peek", peekLimits, got[:0])
		if err != nil {
			t.Fatal(err)
		}
		// second: 15 + 0.1 s × 10 = 16 on the fake clock; Redis keeps its own time, so
		// there 15 plus what refilled since the take.
		lo, hi := 16-1e-9, 16+1e-9
		if advance == nil {
			lo, hi = 15, 17
		}
		if got[0] < lo || got[0] > hi || got[1] < 95 || got[1] > 95.2 {
			t.Fatalf("after a take of 5: %v, want [%g..%g ≈95]", got, lo, hi)
		}
	}
}

func TestMemoryPeek(t *testing.T) {
	fc := clock.NewFake(time.Unix(1_700_000_000, 0))
	m := bucket.NewMemory(fc, 0)
	testPeek(t, m, m, fc.Advance)
}

func TestRedisPeek(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a Redis container")
	}
	r := newRedis(t, testenv.Redis(t).Client())
	testPeek(t, r, r, nil)
}
