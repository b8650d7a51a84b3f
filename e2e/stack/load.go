package stack

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// Call is one check a drill sends: to which enforcer, what, and a class the drill uses to
// judge the answers (e.g. "victim shard", "other shards").
type Call struct {
	To    *Enforcer
	Req   *allotv1.CheckRequest
	Class string
}

// Answer is what one Call got.
type Answer struct {
	Class   string
	To      string        // enforcer id
	At      time.Duration // when it was due, from the start of the run
	Done    time.Duration // when the answer came, from the start of the run: the time windows of admitted counts use it (a lagging load generator bunches calls past their due time)
	Latency time.Duration // from when it was due (queueing counts: no coordinated omission)
	Resp    *allotv1.CheckResponse
	Err     error
}

// Drive offers rate calls a second for d (at most rate × d calls) over workers
// goroutines; next(i) says what call i is (nil: skip it). It returns every answer, in no
// particular order, once all calls have returned. Bounded in count and time: calls still
// waiting 5 s after d are dropped.
func Drive(t testing.TB, ctx context.Context, rate float64, d time.Duration, workers int, next func(i int64, at time.Duration) *Call) []Answer {
	t.Helper()
	total := int64(rate * d.Seconds())
	interval := time.Duration(float64(time.Second) / rate)
	ctx, cancel := context.WithTimeout(ctx, d+5*time.Second)
	defer cancel()
	var n atomic.Int64
	out := make([][]Answer, workers)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := n.Add(1) - 1
				if i >= total || ctx.Err() != nil {
					return
				}
				due := time.Duration(i) * interval
				if wait := time.Until(start.Add(due)); wait > 0 {
					tm := time.NewTimer(wait)
					select {
					case <-tm.C:
					case <-ctx.Done():
						tm.Stop()
						return
					}
				}
				c := next(i, due)
				if c == nil {
					continue
				}
				resp, err := c.To.Check(t, context.WithoutCancel(ctx), c.Req)
				out[w] = append(out[w], Answer{Class: c.Class, To: c.To.ID, At: due, Done: time.Since(start), Latency: time.Since(start.Add(due)), Resp: resp, Err: err})
			}
		}()
	}
	wg.Wait()
	var all []Answer
	for _, a := range out {
		all = append(all, a...)
	}
	return all
}

// Tally sums answers.
type Tally struct {
	Calls, Errors, Allowed, Refused int64
	Sources                         map[string]int64 // allotv1.Source name (without SOURCE_) → answers
	FirstErr                        error
	Latencies                       []time.Duration // sorted
}

// Count tallies the answers for which keep returns true (nil: all).
func Count(answers []Answer, keep func(a *Answer) bool) Tally {
	tl := Tally{Sources: map[string]int64{}}
	for i := range answers {
		a := &answers[i]
		if keep != nil && !keep(a) {
			continue
		}
		tl.Calls++
		tl.Latencies = append(tl.Latencies, a.Latency)
		if a.Err != nil {
			tl.Errors++
			if tl.FirstErr == nil {
				tl.FirstErr = a.Err
			}
			continue
		}
		if a.Resp.GetAllowed() {
			tl.Allowed++
		} else {
			tl.Refused++
		}
		tl.Sources[SourceName(a.Resp.GetSource())]++
	}
	slices.Sort(tl.Latencies)
	return tl
}

// SourceName is "redis", "lease", "fallback", ... for a Source.
func SourceName(s allotv1.Source) string {
	name := s.String()
	if len(name) > 7 && name[:7] == "SOURCE_" {
		name = name[7:]
	}
	b := []byte(name)
	for i, c := range b {
		switch {
		case c >= 'A' && c <= 'Z':
			b[i] = c + 'a' - 'A'
		case c == '_':
			b[i] = '-'
		}
	}
	return string(b)
}

// Quantile is the q-quantile of the tallied latencies (0 when there are none).
func (tl *Tally) Quantile(q float64) time.Duration {
	if len(tl.Latencies) == 0 {
		return 0
	}
	return tl.Latencies[int(q*float64(len(tl.Latencies)-1))]
}

// MaxWindow is the most answers allowed in any window of length w (sliding over the
// times the answers came), among those keep selects.
func MaxWindow(answers []Answer, w time.Duration, keep func(a *Answer) bool) int {
	var at []time.Duration
	for i := range answers {
		a := &answers[i]
		if a.Err == nil && a.Resp.GetAllowed() && (keep == nil || keep(a)) {
			at = append(at, a.Done)
		}
	}
	slices.Sort(at)
	best, lo := 0, 0
	for hi := range at {
		for at[hi]-at[lo] >= w {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

// Timeline is, per step of the run, how many answers of those keep selects came from
// each source ("3s: lease 120 redis 14 fallback 2"), one line per step, for the logs.
func Timeline(answers []Answer, step time.Duration, keep func(a *Answer) bool) string {
	type row map[string]int
	var rows []row
	for i := range answers {
		a := &answers[i]
		if keep != nil && !keep(a) {
			continue
		}
		k := int(a.At / step)
		for len(rows) <= k {
			rows = append(rows, row{})
		}
		src := "error"
		if a.Err == nil {
			src = SourceName(a.Resp.GetSource())
			if !a.Resp.GetAllowed() {
				src += "(refused)"
			}
		}
		rows[k][src]++
	}
	var b []byte
	for k, r := range rows {
		names := make([]string, 0, len(r))
		for n := range r {
			names = append(names, n)
		}
		slices.Sort(names)
		b = fmt.Appendf(b, "\n  %5v:", time.Duration(k)*step)
		for _, n := range names {
			b = fmt.Appendf(b, " %s %d", n, r[n])
		}
	}
	return string(b)
}

// Shared reports whether an answer came from the region's shared counts (Redis, leased
// tokens, the refusal cache of a Redis answer) rather than from local limits (fallback,
// fail-open, fail-closed). A breaker opens on deadline misses, and on a starved machine a
// healthy shard can miss 5 ms deadlines five times in a row: its answers then come from
// fallback, which errs over by design (up to slack × the limit, docs/design.md §7). Drills of
// the shared paths judge Shared answers against their promise and report the local ones.
func Shared(a *Answer) bool {
	if a.Err != nil {
		return false
	}
	switch SourceName(a.Resp.GetSource()) {
	case "redis", "lease", "refusal-cache":
		return true
	}
	return false
}
