// Package routine is the one way allot runs a goroutine that belongs to a value: started
// once, stopped by the owner's Close, and waited for.
//
// An owner embeds a Routine and calls Start (a goroutine of its own) or Run (the caller's
// goroutine, for a Run(ctx) method) with the function to run; that function gets a context
// which Close cancels. Close is idempotent and every call waits until the function has
// returned, so an owner's Close that calls it is bounded whenever the function honours
// its context. Owners that need to select on the goroutine's end use Done.
//
//	type Watcher struct {
//		loop routine.Routine
//		...
//	}
//	func (w *Watcher) Start() error { return w.loop.Start(w.run) }
//	func (w *Watcher) Close() error { w.loop.Close(); return nil }
package routine

import (
	"context"
	"errors"
	"sync"
)

var (
	// ErrStarted is returned by a second Start or Run: a Routine runs its function once.
	ErrStarted = errors.New("routine: already started")
	// ErrClosed is returned by Start or Run after Close, and by Run when Close ended it.
	ErrClosed = errors.New("routine: closed")
)

// Routine is one goroutine an owner runs at most once and stops with Close.
//
// Guarantees: the function given to Start or Run runs at most once; its context ends at
// the first Close (or, for Run, when the caller's context ends); Close returns only after
// the function has returned — on every call, including a second one made while the first
// is still waiting. Close before Start means the function never runs.
//
// The zero value is ready to use; a Routine must not be copied after first use. Safe for
// concurrent use.
type Routine struct {
	mu      sync.Mutex // mu guards started, closed, cancel and done
	started bool
	closed  bool
	cancel  context.CancelFunc // ends the function's context; nil until started
	done    chan struct{}      // closed when the function has returned, or at Close if it never ran
}

// Start runs f in a new goroutine with a context that Close cancels. It returns
// ErrClosed after Close and ErrStarted if Start or Run was called before.
func (r *Routine) Start(f func(ctx context.Context)) error {
	ctx, done, err := r.begin(context.Background())
	if err != nil {
		return err
	}
	go r.run(ctx, done, f)
	return nil
}

// Run runs f in the caller's goroutine, as Start would in a new one, with a context that
// ends when ctx does or at Close. It returns ErrStarted or ErrClosed without running f as
// Start does; once f has returned it returns ErrClosed if Close was called, else
// ctx.Err() (nil when f returned on its own).
func (r *Routine) Run(ctx context.Context, f func(ctx context.Context)) error {
	fctx, done, err := r.begin(ctx)
	if err != nil {
		return err
	}
	r.run(fctx, done, f)
	if r.Closed() {
		return ErrClosed
	}
	return ctx.Err()
}

func (r *Routine) begin(parent context.Context) (context.Context, chan struct{}, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return nil, nil, ErrClosed
	case r.started:
		return nil, nil, ErrStarted
	}
	r.started = true
	ctx, cancel := context.WithCancel(parent)
	r.cancel = cancel
	return ctx, r.doneLocked(), nil
}

func (r *Routine) run(ctx context.Context, done chan struct{}, f func(ctx context.Context)) {
	defer close(done)
	defer r.cancel() // release the context's resources (Run's is a child of the caller's)
	f(ctx)
}

// Close cancels the function's context and waits until the function has returned (at
// once if it never started; it never will). Idempotent: every call waits.
func (r *Routine) Close() {
	r.mu.Lock()
	first := !r.closed
	r.closed = true
	done := r.doneLocked()
	if first && !r.started {
		close(done)
	}
	cancel := r.cancel
	r.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	<-done
}

// Done returns a channel closed once the function has returned, or at Close if it never
// started. Before Start and Close it is open.
func (r *Routine) Done() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.doneLocked()
}

// Started reports whether Start or Run has run (or is running) the function.
func (r *Routine) Started() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.started
}

// Closed reports whether Close has been called.
func (r *Routine) Closed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// doneLocked returns done, making it on first use. Caller holds r.mu.
func (r *Routine) doneLocked() chan struct{} {
	if r.done == nil {
		r.done = make(chan struct{})
	}
	return r.done
}
