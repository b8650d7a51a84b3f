package fallback

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// starvedHarness is a harness whose starvation signal the test drives.
func starvedHarness(t *testing.T) (*harness, *atomic.Uint64) {
	h := newHarness(t, nil)
	var slow atomic.Uint64
	h.s.starve = slow.Load
	return h, &slow
}

// A shard failing while this process is starved opens only after StallGrace; its failed
// checks are answered locally meanwhile.
func TestStarvedProcessWaitsStallGrace(t *testing.T) {
	h, slow := starvedHarness(t)
	h.next.set("a", down)
	h.take(t, req("a:k", 100, 100)) // the run of failures begins
	slow.Add(3)                     // goroutines waited ≥ Timeout/2 to run
	for i := 0; i < 3*h.s.cfg.TripAfter; i++ {
		if res := h.take(t, req("a:k", 100, 100)); res.Source != bucket.SourceFallback {
			t.Fatalf("failed check %d answered from %v, want fallback", i, res.Source)
		}
		h.clk.Advance(10 * time.Millisecond)
	}
	if st := h.s.State("a"); st != Closed {
		t.Fatalf("starved, within StallGrace: %v, want closed", st)
	}
	h.clk.Advance(h.s.cfg.StallGrace)
	h.take(t, req("a:k", 100, 100))
	if st := h.s.State("a"); st != Open {
		t.Fatalf("failures lasting StallGrace: %v, want open", st)
	}
}

// A stall ends and the shard answers again: the breaker never opened, so checks are exact
// again at once instead of local for OpenFor, and the failure count starts over.
func TestStallEndsWithoutOpening(t *testing.T) {
	h, slow := starvedHarness(t)
	h.next.set("a", down)
	h.take(t, req("a:k", 100, 100))
	slow.Add(1)
	for i := 0; i < h.s.cfg.TripAfter; i++ {
		h.take(t, req("a:k", 100, 100))
	}
	h.next.set("a", healthy)
	if res := h.take(t, req("a:k", 100, 100)); res.Source != bucket.SourceRedis {
		t.Fatalf("after the stall answered from %v, want redis", res.Source)
	}
	h.next.set("a", down)
	for i := 1; i < h.s.cfg.TripAfter; i++ {
		h.take(t, req("a:k", 100, 100))
	}
	if st := h.s.State("a"); st != Closed {
		t.Fatalf("TripAfter-1 failures after recovery: %v, want closed", st)
	}
	h.take(t, req("a:k", 100, 100)) // not starved during this run: opens at TripAfter
	if st := h.s.State("a"); st != Open {
		t.Fatalf("TripAfter failures of a process not starved: %v, want open", st)
	}
}

func TestStallGraceZeroDisablesTheGuard(t *testing.T) {
	cfg := DefaultConfig()
	cfg.StallGrace = 0
	s, err := New(newFakeNext(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.starve != nil {
		t.Fatal("StallGrace 0 still reads the scheduler")
	}
	s2, err := New(newFakeNext(), DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if s2.starve == nil {
		t.Fatal("the default config does not read the scheduler")
	}
}

// The real signal: the runtime's histogram reads, and a threshold nothing reaches counts
// nothing.
func TestStarvationReadsTheRuntime(t *testing.T) {
	if n := newStarvation(time.Hour).slow(); n != 0 {
		t.Fatalf("waits of an hour or more: %d", n)
	}
	newStarvation(time.Nanosecond).slow() // must not panic on any runtime's histogram
}
