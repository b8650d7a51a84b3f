package routine

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// rig runs a Routine whose function waits for its context, counting its calls.
type rig struct {
	r        Routine
	calls    atomic.Int32
	returned atomic.Bool
	began    chan struct{} // one send per call of the function
	cancel   context.CancelFunc
	ctx      context.Context
	runErr   chan error // Run's result, when a step ran it
}

func newRig() *rig {
	g := &rig{began: make(chan struct{}, 2), runErr: make(chan error, 2)}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	return g
}

func (g *rig) f(ctx context.Context) {
	g.calls.Add(1)
	g.began <- struct{}{}
	<-ctx.Done()
	g.returned.Store(true)
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func TestRoutine(t *testing.T) {
	type step struct {
		op   string // start, run, cancel (Run's context), close
		want error  // the call's error; for cancel and close, what a pending Run returns
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"started once, closed twice", []step{
			{"start", nil}, {"start", ErrStarted}, {"run", ErrStarted}, {"close", nil}, {"close", nil}, {"start", ErrClosed}, {"run", ErrClosed}}},
		{"closed before start: never runs", []step{
			{"close", nil}, {"start", ErrClosed}, {"run", ErrClosed}, {"close", nil}}},
		{"run ended by Close", []step{
			{"run", nil}, {"start", ErrStarted}, {"run", ErrStarted}, {"close", ErrClosed}, {"close", nil}}},
		{"run ended by its context", []step{
			{"run", nil}, {"cancel", context.Canceled}, {"run", ErrStarted}, {"close", nil}, {"start", ErrClosed}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newRig()
			defer g.cancel()
			pending := false // a Run is running in the background
			for i, s := range tc.steps {
				switch s.op {
				case "start":
					if err := g.r.Start(g.f); !errors.Is(err, s.want) {
						t.Fatalf("step %d: Start = %v, want %v", i, err, s.want)
					}
					if s.want == nil {
						<-g.began
					}
				case "run":
					go func() { g.runErr <- g.r.Run(g.ctx, g.f) }()
					if s.want == nil {
						<-g.began
						pending = true
					} else if err := <-g.runErr; !errors.Is(err, s.want) {
						t.Fatalf("step %d: Run = %v, want %v", i, err, s.want)
					}
				case "cancel":
					g.cancel()
					if err := <-g.runErr; !errors.Is(err, s.want) {
						t.Fatalf("step %d: Run after its context ended = %v, want %v", i, err, s.want)
					}
					pending = false
				case "close":
					g.r.Close()
					if g.calls.Load() > 0 && !g.returned.Load() {
						t.Fatalf("step %d: Close returned before the function did", i)
					}
					if !isClosed(g.r.Done()) || !g.r.Closed() {
						t.Fatalf("step %d: after Close, Done closed %v, Closed %v", i, isClosed(g.r.Done()), g.r.Closed())
					}
					if pending {
						if err := <-g.runErr; !errors.Is(err, s.want) {
							t.Fatalf("step %d: Run ended by Close = %v, want %v", i, err, s.want)
						}
						pending = false
					}
				default:
					t.Fatalf("step %d: unknown op %q", i, s.op)
				}
				if n := g.calls.Load(); n > 1 {
					t.Fatalf("step %d: the function ran %d times", i, n)
				}
			}
		})
	}
}

// TestCloseWaitsOnEveryCall: a second Close made while the first waits also waits until
// the function has returned.
func TestCloseWaitsOnEveryCall(t *testing.T) {
	var r Routine
	cancelled, release := make(chan struct{}), make(chan struct{})
	var returned atomic.Bool
	if err := r.Start(func(ctx context.Context) {
		<-ctx.Done()
		close(cancelled)
		<-release // the owner's cleanup, still running after the context ended
		returned.Store(true)
	}); err != nil {
		t.Fatal(err)
	}
	early := make(chan bool, 2)
	for range 2 {
		go func() { r.Close(); early <- !returned.Load() }()
	}
	<-cancelled
	if isClosed(r.Done()) {
		t.Fatal("Done closed while the function runs")
	}
	close(release)
	for range 2 {
		if <-early {
			t.Fatal("a Close returned before the function did")
		}
	}
	if !isClosed(r.Done()) {
		t.Fatal("Done open after Close")
	}
}

// TestDone: Done is open before Start, closed when the function returns on its own (Close
// then returns at once), and closed by Close when the function never ran.
func TestDone(t *testing.T) {
	var r Routine
	if isClosed(r.Done()) || r.Started() || r.Closed() {
		t.Fatal("a new Routine is not idle")
	}
	if err := r.Start(func(context.Context) {}); err != nil {
		t.Fatal(err)
	}
	if !r.Started() {
		t.Fatal("Started false after Start")
	}
	<-r.Done() // the function returned on its own
	r.Close()

	var never Routine
	d := never.Done()
	never.Close()
	if !isClosed(d) {
		t.Fatal("Done not closed by Close of a Routine never started")
	}
}
