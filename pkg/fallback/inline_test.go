package fallback

import (
	"runtime"
	"testing"

	"github.com/allot-dev/allot/pkg/bucket"
)

// TestInline: with Config.Inline the next store is called on the checking goroutine (no
// call goroutine, no timer), and the breaker hears every outcome as it does otherwise:
// answers from the store, TripAfter errors open it, the probe after OpenFor closes it.
func TestInline(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Inline = true })
	if r := h.take(t, req("a:k", 10, 10)); r.Source != bucket.SourceRedis || !r.Allowed() {
		t.Fatalf("healthy: %+v, want the store's grant", r)
	}
	before := runtime.NumGoroutine()
	h.trip(t, "a") // TripAfter failing checks, each answered at once
	if runtime.NumGoroutine() > before {
		t.Fatalf("inline calls started goroutines: %d → %d", before, runtime.NumGoroutine())
	}
	if r := h.take(t, req("a:k", 10, 10)); r.Source != bucket.SourceFallback {
		t.Fatalf("open: %+v, want a local answer", r)
	}
	h.next.set("a", healthy)
	h.clk.Advance(h.s.cfg.OpenFor)
	if r := h.take(t, req("a:k", 10, 10)); r.Source != bucket.SourceRedis {
		t.Fatalf("probe: %+v, want the store's answer", r)
	}
	if st := h.s.State("a"); st != Closed {
		t.Fatalf("after a good probe: %v, want closed", st)
	}
}
