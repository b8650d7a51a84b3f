package report

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// go test -run '^$' -bench . -benchmem ./pkg/enforcer/report/

// A pair already tracked: the check path's common case.
func BenchmarkObserveTracked(b *testing.B) {
	tb := newTable(b, nil)
	a := rule("default", 100)
	id := "key:k_123"
	tb.ObserveTake(a, id, 1, true, false, 0, t0)
	b.ReportAllocs()
	for b.Loop() {
		tb.ObserveTake(a, id, 1, true, false, 0, t0)
	}
}

// Many goroutines over 1,000 tracked identities (spread over the stripes).
func BenchmarkObserveTrackedParallel(b *testing.B) {
	tb := newTable(b, nil)
	a := rule("default", 100)
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = "key:k_" + strconv.Itoa(i)
		tb.ObserveTake(a, ids[i], 1, true, false, 0, t0)
	}
	var seq atomic.Uint64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := int(seq.Add(1)) * 7919
		for pb.Next() {
			i++
			tb.ObserveTake(a, ids[i%len(ids)], 1, i%5 != 0, false, 0, t0)
		}
	})
}

// A full table fed identities it never saw: every observe evicts (the bounded-work path;
// its one allocation is the copy of the identity).
func BenchmarkObserveUntrackedEvicting(b *testing.B) {
	tb := newTable(b, nil)
	a := rule("default", 100)
	ids := make([]string, 1<<16)
	for i := range ids {
		ids[i] = "key:k_" + strconv.Itoa(i)
	}
	for _, id := range ids[:tb.cfg.Capacity] {
		tb.ObserveTake(a, id, 1, true, false, 0, t0)
	}
	i := tb.cfg.Capacity
	b.ReportAllocs()
	for b.Loop() {
		tb.ObserveTake(a, ids[i%len(ids)], 1, true, false, 0, t0)
		i++
	}
}

// Draining a full default table (16384 pairs) into a report of 4096.
func BenchmarkReportFull(b *testing.B) {
	tb := newTable(b, nil)
	a := rule("default", 100)
	ids := make([]string, tb.cfg.Capacity)
	for i := range ids {
		ids[i] = "key:k_" + strconv.Itoa(i)
	}
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		for j, id := range ids {
			tb.ObserveTake(a, id, int64(1+j%50), j%9 != 0, false, 0, t0)
		}
		now = now.Add(10 * time.Second)
		b.StartTimer()
		tb.Report(now)
	}
}

// A pair refused at every take, as a key over its limit is: past earlyJump each refusal
// also measures the jump against the time passed (jumpedSoFar), which never fires for a
// pair refused as it was last interval.
func BenchmarkObserveRefused(b *testing.B) {
	tb := newTable(b, nil)
	a := rule("default", 100)
	id := "key:k_123"
	tb.ObserveTake(a, id, 1<<40, false, false, 0, t0) // refused without end last interval
	tb.Report(t0.Add(10 * time.Second))
	now := t0.Add(15 * time.Second)
	b.ReportAllocs()
	for b.Loop() {
		tb.ObserveTake(a, id, 1, false, false, 0, now)
	}
}
