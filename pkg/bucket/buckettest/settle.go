package buckettest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
)

// SettleStore is a store that takes and settles (bucket.Settler).
type SettleStore interface {
	bucket.Store
	bucket.Settler
}

// SettleHarness describes a settling store under test.
type SettleHarness struct {
	// New returns the store for one subtest (it may return the same store every time).
	New func(t *testing.T) SettleStore
	// Clock is the fake clock the store reads, or nil for a real one (Redis's TIME): the
	// buckets are slow enough that a real clock changes no whole-token answer, and a
	// marker's expiry is waited out (tens of milliseconds).
	Clock *clock.Fake
	// Source, when not SourceNone, is the Source every settlement must carry.
	Source bucket.Source
	// Calls, when set, counts what the store sends to its backend: invalid input sends
	// nothing.
	Calls func() uint64
}

// RunSettle runs the settlement checks as subtests of t.
func RunSettle(t *testing.T, h SettleHarness) {
	if h.New == nil {
		t.Fatal("buckettest: SettleHarness.New is required")
	}
	s := &settleSuite{h: &h, run: time.Now().UnixNano()}
	t.Run("SettleUpTakesTheDifference", s.up)
	t.Run("SettleDownRefundsCappedAtBurst", s.down)
	t.Run("SettleTwiceRefused", s.twice)
	t.Run("UnknownOrExpiredRefused", s.unknown)
	t.Run("DebtBoundedByOneBurst", s.debt)
	t.Run("UnmarkedDelta", s.unmarked)
	t.Run("AllBucketsOfTheTake", s.every)
	t.Run("ConcurrentSettlesOneWins", s.concurrent)
	t.Run("InvalidInput", s.invalid)
}

type settleSuite struct {
	h   *SettleHarness
	run int64
	seq atomic.Int64
}

func (s *settleSuite) id(t *testing.T) string {
	return fmt.Sprintf("st:%x:%s:%d", s.run, t.Name(), s.seq.Add(1))
}

func (s *settleSuite) take(t *testing.T, st SettleStore, id string, want int64, ls ...bucket.Limit) bucket.Result {
	t.Helper()
	r, err := st.Take(context.Background(), &bucket.Request{Identity: id, Limits: ls, Want: want})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (s *settleSuite) mark(t *testing.T, st SettleStore, id, mid string, est, cost int64, ttl time.Duration) {
	t.Helper()
	if err := st.Mark(context.Background(), &bucket.Mark{Identity: id, ID: mid, Estimate: est, Cost: cost, TTL: ttl}); err != nil {
		t.Fatal(err)
	}
}

func (s *settleSuite) settle(st SettleStore, id, mid string, actual int64, ls ...bucket.Limit) (bucket.Settled, error) {
	r, err := st.Settle(context.Background(), &bucket.Settlement{Identity: id, Limits: ls, ID: mid, Actual: actual})
	if err == nil && s.h.Source != bucket.SourceNone && r.Source != s.h.Source {
		return r, fmt.Errorf("source %v, want %v", r.Source, s.h.Source)
	}
	return r, err
}

func (s *settleSuite) mustSettle(t *testing.T, st SettleStore, id, mid string, actual int64, ls ...bucket.Limit) bucket.Settled {
	t.Helper()
	r, err := s.settle(st, id, mid, actual, ls...)
	if err != nil {
		t.Fatalf("Settle(%q, actual %d): %v", mid, actual, err)
	}
	return r
}

func (s *settleSuite) pass(d time.Duration) {
	if s.h.Clock != nil {
		s.h.Clock.Advance(d)
		return
	}
	time.Sleep(d)
}

func (s *settleSuite) up(t *testing.T) {
	st, id, l := s.h.New(t), s.id(t), slow("b", 10)
	if r := s.take(t, st, id, 3, l); r.Granted != 3 || r.Remaining != 7 {
		t.Fatalf("estimate: %+v", r)
	}
	s.mark(t, st, id, "m1", 3, 1, time.Minute)
	r := s.mustSettle(t, st, id, "m1", 8, l)
	if r.Delta != 5 || r.Remaining != 2 {
		t.Fatalf("settle 8 of an estimate of 3: %+v, want delta 5, remaining 2", r)
	}
	if r := s.take(t, st, id, 3, l); r.Granted != 0 || r.Remaining != 2 {
		t.Fatalf("after settling up, a take of 3 of the 2 left: %+v", r)
	}
	// The rule's cost multiplies the actual amount: 2 units × cost 2 − estimate 4 = 0.
	s.mark(t, st, id, "m2", 4, 2, time.Minute)
	if r := s.mustSettle(t, st, id, "m2", 2, l); r.Delta != 0 || r.Remaining != 2 {
		t.Fatalf("settle 2 × cost 2 of an estimate of 4: %+v", r)
	}
}

func (s *settleSuite) down(t *testing.T) {
	st, id, l := s.h.New(t), s.id(t), slow("b", 10)
	s.take(t, st, id, 6, l)
	s.mark(t, st, id, "m1", 6, 1, time.Minute)
	if r := s.mustSettle(t, st, id, "m1", 2, l); r.Delta != -4 || r.Remaining != 8 {
		t.Fatalf("settle 2 of an estimate of 6: %+v, want delta -4, remaining 8", r)
	}
	// A refund never fills past the burst: 8 + 5 stops at 10.
	s.mark(t, st, id, "m2", 5, 1, time.Minute)
	if r := s.mustSettle(t, st, id, "m2", 0, l); r.Delta != -5 || r.Remaining != 10 {
		t.Fatalf("refund of 5 to a bucket holding 8 of 10: %+v, want remaining 10", r)
	}
	if r := s.take(t, st, id, 10, l); r.Granted != 10 {
		t.Fatalf("the whole burst after the refund: %+v", r)
	}
	if r := s.take(t, st, id, 1, l); r.Granted != 0 {
		t.Fatalf("one more than the burst was admitted: %+v", r)
	}
}

func (s *settleSuite) twice(t *testing.T) {
	st, id, l := s.h.New(t), s.id(t), slow("b", 10)
	s.take(t, st, id, 5, l)
	s.mark(t, st, id, "m", 5, 1, time.Minute)
	s.mustSettle(t, st, id, "m", 1, l)
	if _, err := s.settle(st, id, "m", 1, l); !errors.Is(err, bucket.ErrNotMarked) {
		t.Fatalf("second settlement: %v, want ErrNotMarked", err)
	}
	// Marking an id again while its marker stands changes nothing (SET NX).
	s.mark(t, st, id, "n", 2, 1, time.Minute)
	s.mark(t, st, id, "n", 9, 1, time.Minute)
	if r := s.mustSettle(t, st, id, "n", 2, l); r.Delta != 0 {
		t.Fatalf("a second mark of one id replaced the first: %+v", r)
	}
	if r := s.take(t, st, id, 1, l); r.Remaining != 8 {
		t.Fatalf("after one refund of 4 to 5 of 10: %+v, want 8 left", r)
	}
}

func (s *settleSuite) unknown(t *testing.T) {
	st, id, l := s.h.New(t), s.id(t), slow("b", 10)
	s.take(t, st, id, 5, l)
	if _, err := s.settle(st, id, "never", 0, l); !errors.Is(err, bucket.ErrNotMarked) {
		t.Fatalf("unknown marker: %v, want ErrNotMarked", err)
	}
	s.mark(t, st, id, "short", 5, 1, 20*time.Millisecond)
	// The same id under another identity is another marker.
	if _, err := s.settle(st, id+"x", "short", 0, l); !errors.Is(err, bucket.ErrNotMarked) {
		t.Fatalf("marker of another identity: %v, want ErrNotMarked", err)
	}
	s.pass(40 * time.Millisecond)
	if _, err := s.settle(st, id, "short", 0, l); !errors.Is(err, bucket.ErrNotMarked) {
		t.Fatalf("expired marker: %v, want ErrNotMarked", err)
	}
	if r := s.take(t, st, id, 1, l); r.Remaining != 4 {
		t.Fatalf("refused settlements changed the bucket: %+v, want 4 left", r)
	}
}

func (s *settleSuite) debt(t *testing.T) {
	st, id, l := s.h.New(t), s.id(t), medium("b", 4)
	s.take(t, st, id, 4, l)
	s.mark(t, st, id, "m", 4, 1, time.Minute)
	// 100 more than the estimate: the bucket goes one burst below zero, no further.
	if r := s.mustSettle(t, st, id, "m", 104, l); r.Delta != 100 || r.Remaining != -4 {
		t.Fatalf("settle far over: %+v, want delta 100, remaining -4", r)
	}
	r := s.take(t, st, id, 1, l)
	if r.Granted != 0 || r.Remaining != 0 {
		t.Fatalf("a take from a bucket in debt: %+v", r)
	}
	// 5 tokens to refill (from -4 to 1) at one per 128 s.
	if want := 5 * tokenOfMedium; r.RetryAfter > want || r.RetryAfter < want-2*time.Second {
		t.Fatalf("retry-after in debt: %v, want about %v", r.RetryAfter, want)
	}
	if s.h.Clock != nil {
		s.pass(5 * tokenOfMedium)
		if r := s.take(t, st, id, 1, l); r.Granted != 1 || r.Remaining != 0 {
			t.Fatalf("after the debt refilled: %+v", r)
		}
	}
}

func (s *settleSuite) unmarked(t *testing.T) {
	st, id, l := s.h.New(t), s.id(t), slow("b", 10)
	r, err := st.Settle(context.Background(), &bucket.Settlement{Identity: id, Limits: []bucket.Limit{l}, Delta: 13})
	if err != nil || r.Delta != 13 || r.Remaining != -3 {
		t.Fatalf("unmarked take of 13 from a full bucket of 10: %+v, %v", r, err)
	}
	r, err = st.Settle(context.Background(), &bucket.Settlement{Identity: id, Limits: []bucket.Limit{l}, Delta: -100})
	if err != nil || r.Remaining != 10 {
		t.Fatalf("unmarked refund of 100: %+v, %v, want 10 (the burst)", r, err)
	}
}

func (s *settleSuite) every(t *testing.T) {
	st, id := s.h.New(t), s.id(t)
	a, b := slow("a", 10), medium("b", 6)
	s.take(t, st, id, 2, a, b)
	s.mark(t, st, id, "m", 2, 1, time.Minute)
	r := s.mustSettle(t, st, id, "m", 5, a, b)
	if r.Delta != 3 || r.Limiting != 1 || r.Remaining != 1 {
		t.Fatalf("settle over two buckets: %+v, want b limiting with 1 left", r)
	}
	if got := s.take(t, st, id, 1, a); got.Remaining != 4 {
		t.Fatalf("bucket a after the settlement: %+v, want 4 left", got)
	}
}

func (s *settleSuite) concurrent(t *testing.T) {
	st, id, l := s.h.New(t), s.id(t), slow("b", 100)
	s.take(t, st, id, 50, l)
	s.mark(t, st, id, "m", 50, 1, time.Minute)
	var won atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.settle(st, id, "m", 0, l)
			switch {
			case err == nil:
				won.Add(1)
			case !errors.Is(err, bucket.ErrNotMarked):
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := won.Load(); n != 1 {
		t.Fatalf("16 settlements of one marker: %d succeeded, want 1", n)
	}
	if r := s.take(t, st, id, 1, l); r.Remaining != 99 {
		t.Fatalf("after one refund of 50: %+v, want 99 left", r)
	}
}

func (s *settleSuite) invalid(t *testing.T) {
	st, l := s.h.New(t), slow("b", 10)
	var before uint64
	if s.h.Calls != nil {
		before = s.h.Calls()
	}
	marks := map[string]bucket.Mark{
		"empty identity": {ID: "m", Estimate: 1, Cost: 1, TTL: time.Second},
		"empty id":       {Identity: "i", Estimate: 1, Cost: 1, TTL: time.Second},
		"estimate 0":     {Identity: "i", ID: "m", Cost: 1, TTL: time.Second},
		"cost 0":         {Identity: "i", ID: "m", Estimate: 1, TTL: time.Second},
		"ttl 0":          {Identity: "i", ID: "m", Estimate: 1, Cost: 1},
		"long id":        {Identity: "i", ID: string(make([]byte, bucket.MaxMarkIDLen+1)), Estimate: 1, Cost: 1, TTL: time.Second},
	}
	for name, m := range marks {
		if err := st.Mark(context.Background(), &m); !errors.Is(err, bucket.ErrInvalid) {
			t.Errorf("Mark %s: %v, want ErrInvalid", name, err)
		}
	}
	settles := map[string]bucket.Settlement{
		"no limits":      {Identity: "i", ID: "m"},
		"negative":       {Identity: "i", ID: "m", Limits: []bucket.Limit{l}, Actual: -1},
		"huge delta":     {Identity: "i", Limits: []bucket.Limit{l}, Delta: bucket.MaxSettle + 1},
		"bad rate":       {Identity: "i", Limits: []bucket.Limit{{Name: "x", Rate: -1, Burst: 1}}},
		"duplicate name": {Identity: "i", Limits: []bucket.Limit{l, l}},
		"empty identity": {Limits: []bucket.Limit{l}},
	}
	for name, x := range settles {
		if _, err := st.Settle(context.Background(), &x); !errors.Is(err, bucket.ErrInvalid) {
			t.Errorf("Settle %s: %v, want ErrInvalid", name, err)
		}
	}
	if s.h.Calls != nil && s.h.Calls() != before {
		t.Fatalf("invalid input sent %d commands", s.h.Calls()-before)
	}
}
