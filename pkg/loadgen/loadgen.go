// Package loadgen drives bounded load at a check function and measures it: closed loop
// (C callers as fast as they can, for throughput) and open loop (a fixed offered rate,
// latency counted from each request's intended send time, so a stalled server cannot hide
// its queueing — no coordinated omission).
//
// Every run is bounded in both count and time and stops by itself.
package loadgen

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// CheckFunc performs one check for key index k. It returns an error only for a failed call
// (not for a refusal).
type CheckFunc func(ctx context.Context, k int) error

// Keys draws key indexes in [0, N) with a Zipf distribution (s > 1): a few keys carry most
// of the traffic, as real API traffic does. Not safe for concurrent use: one per caller.
type Keys struct{ z *rand.Zipf }

// NewKeys returns a Zipf key source over n keys with exponent s (e.g. 1.1), seeded.
func NewKeys(n int, s float64, seed uint64) *Keys {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	return &Keys{z: rand.NewZipf(r, s, 1, uint64(n-1))}
}

// Next returns the next key index.
func (k *Keys) Next() int { return int(k.z.Uint64()) }

// Result summarises a run.
type Result struct {
	Calls   int64
	Errors  int64
	Elapsed time.Duration
	Latency []time.Duration // sorted; open loop: from intended send time
	Dropped int64           // open loop: sends that could not start because every worker was busy past the bound
	// SendLate is, sorted, how late the open loop handed each call to a worker, from the
	// moment it was due: the generator's own lateness, part of Latency (a worker busy, or
	// the generator not running when the call was due).
	SendLate []time.Duration
	FirstErr error
}

// PerSecond is the completed calls per second.
func (r *Result) PerSecond() float64 { return float64(r.Calls) / r.Elapsed.Seconds() }

// Quantile returns the q-quantile (0..1) of the recorded latencies.
func (r *Result) Quantile(q float64) time.Duration { return quantile(r.Latency, q) }

// SendLateQuantile returns the q-quantile (0..1) of SendLate.
func (r *Result) SendLateQuantile(q float64) time.Duration { return quantile(r.SendLate, q) }

// Merge returns one Result of the runs rs, as if they were one run of their total length:
// calls, errors, drops and elapsed times add, latencies are pooled. The first error of the
// first run that had one is kept.
func Merge(rs ...*Result) *Result {
	m := &Result{}
	for _, r := range rs {
		m.Calls += r.Calls
		m.Errors += r.Errors
		m.Dropped += r.Dropped
		m.Elapsed += r.Elapsed
		m.Latency = append(m.Latency, r.Latency...)
		m.SendLate = append(m.SendLate, r.SendLate...)
		if m.FirstErr == nil {
			m.FirstErr = r.FirstErr
		}
	}
	slices.Sort(m.Latency)
	slices.Sort(m.SendLate)
	return m
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(q*float64(len(sorted)-1))]
}

// ClosedLoop runs callers goroutines, each calling check back to back, until maxCalls
// calls in total or d has passed, whichever comes first.
func ClosedLoop(ctx context.Context, callers int, d time.Duration, maxCalls int64, keys func(worker int) *Keys, check CheckFunc) *Result {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var calls, errs atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < callers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			ks := keys(w)
			for ctx.Err() == nil && calls.Add(1) <= maxCalls {
				if err := check(ctx, ks.Next()); err != nil && ctx.Err() == nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}(w)
	}
	wg.Wait()
	res := &Result{Calls: min(calls.Load(), maxCalls), Errors: errs.Load(), Elapsed: time.Since(start)}
	if e, ok := firstErr.Load().(error); ok {
		res.FirstErr = e
	}
	return res
}

// ErrBadRate is returned for a non-positive rate or duration.
var ErrBadRate = errors.New("loadgen: rate and duration must be > 0")

// OpenLoop offers rate calls per second for d (at most rate×d calls), spread over workers
// goroutines. Each call's latency is measured from the moment it was due to be sent, so
// time spent waiting for a free worker counts against the server.
func OpenLoop(ctx context.Context, rate float64, d time.Duration, workers int, keys *Keys, check CheckFunc) (*Result, error) {
	if rate <= 0 || d <= 0 {
		return nil, ErrBadRate
	}
	total := int64(rate * d.Seconds())
	interval := time.Duration(float64(time.Second) / rate)
	type job struct {
		due time.Time
		key int
	}
	jobs := make(chan job, workers*4)
	lat := make([][]time.Duration, workers)
	var errs atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	// The deadline bounds the run even if the server stalls: calls still queued then are
	// abandoned and counted as dropped.
	ctx, cancel := context.WithTimeout(ctx, d+5*time.Second)
	defer cancel()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for j := range jobs {
				if ctx.Err() != nil {
					continue
				}
				if err := check(ctx, j.key); err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
				lat[w] = append(lat[w], time.Since(j.due))
			}
		}(w)
	}
	// Tick n (from 1) is the moment call n-1 is due. start is read before the ticker is
	// armed, so a due time is never later than the kernel's tick: if anything, the
	// generator's lateness is over-counted by the few µs it takes to arm it.
	start := time.Now()
	tick, err := newTicker(ctx, interval)
	if err != nil {
		cancel()
		close(jobs)
		wg.Wait()
		return nil, err
	}
	defer tick.close()
	var sent int64
	var late []time.Duration
sending:
	for sent < total {
		n, err := tick.wait()
		if err != nil { // the context ended
			break
		}
		for range min(n, total-sent) {
			due := start.Add(time.Duration(sent+1) * interval)
			select {
			case jobs <- job{due: due, key: keys.Next()}:
			case <-ctx.Done():
				break sending
			}
			late = append(late, time.Since(due))
			sent++
		}
	}
	close(jobs)
	wg.Wait()
	slices.Sort(late)
	res := &Result{Errors: errs.Load(), Elapsed: time.Since(start), Dropped: total - sent, SendLate: late}
	for _, l := range lat {
		res.Latency = append(res.Latency, l...)
	}
	slices.Sort(res.Latency)
	res.Calls = int64(len(res.Latency))
	if e, ok := firstErr.Load().(error); ok {
		res.FirstErr = e
	}
	return res, nil
}

// ticker is the open loop's schedule (pace_linux.go, pace_other.go): wait blocks until the
// next tick of a fixed interval and returns how many ticks passed since the previous wait.
type ticker interface {
	wait() (int64, error)
	close()
}
