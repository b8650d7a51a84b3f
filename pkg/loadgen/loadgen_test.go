package loadgen

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestClosedLoopStopsAtMaxCalls(t *testing.T) {
	res := ClosedLoop(context.Background(), 8, time.Minute, 1000,
		func(w int) *Keys { return NewKeys(100, 1.1, uint64(w)) },
		func(context.Context, int) error { return nil })
	if res.Calls != 1000 || res.Errors != 0 {
		t.Fatalf("calls=%d errors=%d, want 1000 and 0", res.Calls, res.Errors)
	}
}

func TestOpenLoopOffersTheRateAndCountsErrors(t *testing.T) {
	boom := errors.New("boom")
	n := 0
	res, err := OpenLoop(context.Background(), 2000, 100*time.Millisecond, 1, NewKeys(10, 1.5, 1),
		func(context.Context, int) error {
			n++ // one worker: no race
			if n%10 == 0 {
				return boom
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if res.Calls != 200 || res.Errors != 20 || !errors.Is(res.FirstErr, boom) {
		t.Fatalf("calls=%d errors=%d first=%v, want 200, 20, boom", res.Calls, res.Errors, res.FirstErr)
	}
	if res.Quantile(0) > res.Quantile(0.99) {
		t.Fatalf("latencies not sorted")
	}
	if _, err := OpenLoop(context.Background(), 0, time.Second, 1, NewKeys(10, 1.5, 1), nil); !errors.Is(err, ErrBadRate) {
		t.Fatalf("rate 0: err=%v, want ErrBadRate", err)
	}
}

func TestZipfIsSkewed(t *testing.T) {
	k := NewKeys(10000, 1.1, 7)
	top := 0
	for i := 0; i < 10000; i++ {
		if k.Next() < 10 {
			top++
		}
	}
	if top < 3000 { // the 10 hottest keys of 10,000 carry a large part of the traffic
		t.Fatalf("top-10 keys got %d of 10000 draws; not skewed", top)
	}
}

// Merge adds the counts and pools the latencies of its runs: two runs of 1 s read as one of
// 2 s, their quantiles those of all their calls.
func TestMerge(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	e := errors.New("first")
	a := &Result{Calls: 3, Elapsed: time.Second, Latency: ms(1, 2, 9), SendLate: ms(0, 1, 1)}
	b := &Result{Calls: 2, Errors: 1, Dropped: 4, Elapsed: time.Second, Latency: ms(3, 4), SendLate: ms(0, 2), FirstErr: e}
	m := Merge(a, b)
	if m.Calls != 5 || m.Errors != 1 || m.Dropped != 4 || m.Elapsed != 2*time.Second || m.FirstErr != e {
		t.Fatalf("merged %+v", m)
	}
	if m.PerSecond() != 2.5 {
		t.Fatalf("PerSecond %v, want 2.5", m.PerSecond())
	}
	if got := m.Quantile(0.5); got != 3*time.Millisecond {
		t.Fatalf("median %v, want 3ms (of 1 2 3 4 9)", got)
	}
	if got := m.SendLateQuantile(1); got != 2*time.Millisecond {
		t.Fatalf("send lateness max %v, want 2ms", got)
	}
	if len(a.Latency) != 3 || a.Latency[2] != 9*time.Millisecond {
		t.Fatalf("Merge changed its input: %v", a.Latency)
	}
}
