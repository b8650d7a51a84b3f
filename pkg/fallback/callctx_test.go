package fallback

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/clock"
)

type ctxKey struct{}

// ctxStore returns a Store whose clock and Timeout the call contexts use.
func ctxStore(t *testing.T, c clock.Clock, timeout time.Duration) *Store {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Clock, cfg.Timeout = c, timeout
	s, err := New(newFakeNext(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestCallCtxDeadlineOnFakeClock(t *testing.T) {
	clk := clock.NewFake(t0)
	parent := context.WithValue(context.Background(), ctxKey{}, "v")
	c := callCtxOf(parent, ctxStore(t, clk, 5*time.Millisecond))
	defer c.release()

	if dl, ok := c.Deadline(); !ok || !dl.Equal(t0.Add(5*time.Millisecond)) {
		t.Fatalf("Deadline() = %v, %v", dl, ok)
	}
	if v := c.Value(ctxKey{}); v != "v" {
		t.Fatalf("Value = %v, want the parent's", v)
	}
	if err := c.Err(); err != nil {
		t.Fatalf("Err before the deadline = %v", err)
	}
	done := c.Done()
	clk.Advance(5*time.Millisecond - time.Microsecond)
	select {
	case <-done:
		t.Fatal("done before the deadline")
	default:
	}
	clk.Advance(time.Microsecond)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("not done 10s after the deadline")
	}
	if err := c.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Err = %v, want DeadlineExceeded", err)
	}
}

func TestCallCtxParentCancel(t *testing.T) {
	clk := clock.NewFake(t0)
	parent, cancel := context.WithCancel(context.Background())
	c := callCtxOf(parent, ctxStore(t, clk, time.Hour))
	defer c.release()
	done := c.Done()
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("parent cancel did not reach the call context")
	}
	if err := c.Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Err = %v, want Canceled", err)
	}
	// A context derived from the call context follows it.
	child, stop := context.WithCancel(c)
	defer stop()
	if child.Err() == nil {
		t.Fatal("child of a cancelled call context is not cancelled")
	}
}

func TestCallCtxEarlierParentDeadline(t *testing.T) {
	parentDL := time.Now().Add(time.Millisecond)
	parent, cancel := context.WithDeadline(context.Background(), parentDL)
	defer cancel()
	c := callCtxOf(parent, ctxStore(t, clock.Real(), time.Hour))
	defer c.release()
	if dl, _ := c.Deadline(); !dl.Equal(parentDL) {
		t.Fatalf("Deadline() = %v, want the parent's earlier %v", dl, parentDL)
	}
}

func TestCallCtxAlreadyDone(t *testing.T) {
	clk := clock.NewFake(t0)
	c := callCtxOf(context.Background(), ctxStore(t, clk, time.Millisecond))
	defer c.release()
	c.Deadline()                      // fixes the deadline at t0 + 1ms
	clk.Advance(2 * time.Millisecond) // and it passes before anyone watches Done
	if err := c.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Err = %v, want DeadlineExceeded", err)
	}
	if clk.Timers() != 0 {
		t.Fatal("a timer was started for a passed deadline")
	}
}

func TestCallCtxRelease(t *testing.T) {
	clk := clock.NewFake(t0)
	// Watched: released means cancelled, and the timer is gone.
	s := ctxStore(t, clk, time.Second)
	c := callCtxOf(context.Background(), s)
	done := c.Done()
	if clk.Timers() != 1 {
		t.Fatalf("%d timers after Done, want 1", clk.Timers())
	}
	c.release()
	<-done
	if err := c.Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Err after release = %v, want Canceled", err)
	}
	if clk.Timers() != 0 {
		t.Fatal("release left the timer running")
	}
	// Never watched: a context kept past the call is cancelled when first asked.
	c = callCtxOf(context.Background(), s)
	c.release()
	if err := c.Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Err of a released, never-watched context = %v, want Canceled", err)
	}
	if clk.Timers() != 0 {
		t.Fatal("a released context started a timer")
	}
	c.release() // twice is harmless
}

// TestCallCtxRealClock covers the time.AfterFunc branch with a 1 ms real deadline.
func TestCallCtxRealClock(t *testing.T) {
	if !isReal(clock.Real()) || isReal(clock.NewFake(t0)) {
		t.Fatal("isReal misclassifies the clocks")
	}
	c := callCtxOf(context.Background(), ctxStore(t, clock.Real(), time.Millisecond))
	defer c.release()
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("real deadline did not fire")
	}
	if err := c.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Err = %v, want DeadlineExceeded", err)
	}
}

// TestCallCtxDeadlineFixedOnFirstLook: the deadline is Timeout after the next store first
// looks at its context, and stays put after that.
func TestCallCtxDeadlineFixedOnFirstLook(t *testing.T) {
	clk := clock.NewFake(t0)
	c := callCtxOf(context.Background(), ctxStore(t, clk, 5*time.Millisecond))
	defer c.release()
	clk.Advance(3 * time.Millisecond)
	want := t0.Add(8 * time.Millisecond)
	if dl, _ := c.Deadline(); !dl.Equal(want) {
		t.Fatalf("Deadline() = %v, want %v", dl, want)
	}
	clk.Advance(time.Millisecond)
	if dl, _ := c.Deadline(); !dl.Equal(want) {
		t.Fatalf("Deadline moved to %v", dl)
	}
}

// callCtxOf is the context of an ordinary (not probe) call with the store's base Timeout.
func callCtxOf(parent context.Context, s *Store) *callCtx {
	return newCallCtx(parent, s, s.cfg.Timeout)
}
