package bucket_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
)

var t0 = time.Unix(1_700_000_000, 0)

func take(t *testing.T, s bucket.Store, id string, want, min int64, limits ...bucket.Limit) bucket.Result {
	t.Helper()
	r, err := s.Take(context.Background(), &bucket.Request{Identity: id, Limits: limits, Want: want, Min: min})
	if err != nil {
		t.Fatalf("Take(%q): %v", id, err)
	}
	return r
}

// Two rules of one identity taken by different requests keep their own buckets: a request
// that carries only one of them must not reset the other.
func TestMemoryKeepsBucketsOfOtherRequests(t *testing.T) {
	fc := clock.NewFake(t0)
	m := bucket.NewMemory(fc, 0)
	a := bucket.Limit{Name: "endpoint-a", Rate: 0.001, Burst: 2}
	b := bucket.Limit{Name: "endpoint-b", Rate: 0.001, Burst: 2}
	g := bucket.Limit{Name: "global", Rate: 0.001, Burst: 100}
	for i := 0; i < 2; i++ {
		if r := take(t, m, "k", 1, 0, g, a); r.Granted != 1 {
			t.Fatalf("take %d from a: %+v", i, r)
		}
		if r := take(t, m, "k", 1, 0, g, b); r.Granted != 1 {
			t.Fatalf("take %d from b: %+v", i, r)
		}
	}
	if r := take(t, m, "k", 1, 0, g, a); r.Granted != 0 || r.Limiting != 1 {
		t.Fatalf("a is empty, but got %+v", r)
	}
	if r := take(t, m, "k", 1, 0, g); r.Granted != 1 || r.Remaining != 95 {
		t.Fatalf("global should have 96 left before this take: %+v", r)
	}
}

// A wall clock stepping back refills nothing, and stepping forward again does not refill
// the same interval twice.
func TestMemoryClockStepsBack(t *testing.T) {
	var now time.Time = t0
	m := bucket.NewMemory(stepClock{&now}, 0)
	l := bucket.Limit{Name: "s", Rate: 1, Burst: 2}
	if r := take(t, m, "k", 1, 0, l); r.Granted != 1 {
		t.Fatalf("first take: %+v", r)
	}
	now = t0.Add(-10 * time.Second)
	if r := take(t, m, "k", 1, 0, l); r.Granted != 1 || r.Remaining != 0 {
		t.Fatalf("after the clock went back: %+v", r)
	}
	now = t0.Add(750 * time.Millisecond)
	if r := take(t, m, "k", 1, 0, l); r.Granted != 0 || r.RetryAfter != 250*time.Millisecond {
		t.Fatalf("the clock is back where it was: the bucket must not have refilled: %+v", r)
	}
}

type stepClock struct{ now *time.Time }

func (c stepClock) Now() time.Time                       { return *c.now }
func (c stepClock) NewTimer(d time.Duration) clock.Timer { panic("not used") }

func TestMemoryBoundedKeys(t *testing.T) {
	fc := clock.NewFake(t0)
	m := bucket.NewMemory(fc, 640)
	l := bucket.Limit{Name: "s", Rate: 1, Burst: 5}
	for i := 0; i < 100_000; i++ {
		take(t, m, "key-"+itoa(i), 1, 0, l)
	}
	if n := m.Len(); n > 640+64 {
		t.Fatalf("memory holds %d identities, bound 640", n)
	}
}

func itoa(i int) string {
	var b [20]byte
	n := len(b)
	for {
		n--
		b[n] = byte('0' + i%10)
		if i /= 10; i == 0 {
			return string(b[n:])
		}
	}
}

// In-flight slot sets are bounded like buckets: identities invented without end keep the
// store near its bound, and the sets still in use are the last to go.
func TestMemoryInflightBounded(t *testing.T) {
	fc := clock.NewFake(t0)
	m := bucket.NewMemory(fc, 640) // 10 a shard
	ctx := context.Background()
	for i := range 20_000 {
		h := &bucket.Hold{Identity: fmt.Sprintf("key:%d", i), Name: "r/c", Handle: "h", Cap: 5, Timeout: time.Second}
		if r, err := m.Acquire(ctx, h); err != nil || !r.Held {
			t.Fatalf("acquire %d: %+v %v", i, r, err)
		}
		if i%3 == 0 {
			fc.Advance(time.Millisecond)
		}
	}
	if n := m.HeldKeys(); n > 640 {
		t.Fatalf("%d slot sets kept after 20,000 invented identities, want <= 640", n)
	}
}
