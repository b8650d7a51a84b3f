package lease

import (
	"fmt"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// TestTakeCachedThenTakeIsTake: asking TakeCached first and Take on a miss (what
// pkg/fallback does) gives the same answers, calls and demand counts as Take alone: a miss
// is not counted twice.
func TestTakeCachedThenTakeIsTake(t *testing.T) {
	alone, layered := newFixture(t, nil), newFixture(t, nil)
	r := req("k", 200, 200, 1)
	var hits int
	for i := range 400 {
		a := alone.take(alone.s, r)
		l, ok := layered.s.TakeCached(r)
		if ok {
			hits++
		} else {
			l = layered.take(layered.s, r)
		}
		alone.s.settle()
		layered.s.settle()
		if a != l {
			t.Fatalf("check %d: Take %+v, TakeCached/Take %+v", i, a, l)
		}
		step := time.Millisecond
		if i%50 == 49 {
			step = 300 * time.Millisecond // gaps: quiet periods, expiries
		}
		alone.clk.Advance(step)
		layered.clk.Advance(step)
	}
	if a, l := alone.next.calls.Load(), layered.next.calls.Load(); a != l {
		t.Fatalf("calls: Take alone %d, layered %d", a, l)
	}
	if hits == 0 {
		t.Fatal("TakeCached never answered")
	}
	t.Logf("400 checks: %d answered by TakeCached, %d calls", hits, layered.next.calls.Load())
}

func TestTakeCached(t *testing.T) {
	f := newFixture(t, nil)
	r := req("k", 1000, 1000, 1)
	if _, ok := f.s.TakeCached(r); ok {
		t.Fatal("TakeCached answered a key it holds nothing for")
	}
	if _, ok := f.s.TakeCached(&bucket.Request{Identity: "k"}); ok {
		t.Fatal("TakeCached answered an invalid request")
	}
	for range 3 {
		f.take(f.s, r) // busy: the third leases a batch
	}
	res, ok := f.s.TakeCached(r)
	if !ok || res.Source != bucket.SourceLease || res.Granted != 1 {
		t.Fatalf("TakeCached on a leased key: %+v, %v", res, ok)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if _, ok := f.s.TakeCached(r); !ok {
			panic(fmt.Sprint("lease ran dry; held ", f.s.heldFor("k")))
		}
		f.s.settle()
	})
	if allocs > 0 {
		t.Fatalf("TakeCached: %v allocations, want 0", allocs)
	}
	f.s.Close()
	if _, ok := f.s.TakeCached(r); ok {
		t.Fatal("TakeCached answered after Close")
	}
}
