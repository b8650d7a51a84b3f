package fallback

import (
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/allot-dev/allot/pkg/bucket"
)

// TestLocalAnswersSayWhy: every local answer is reported with its reason: checks whose
// wait passed on a silent shard with its breaker closed (logged once for the run), a check
// finding the shard at MaxInFlight, a check on an open breaker, a check whose own call
// failed.
func TestLocalAnswersSayWhy(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxInFlight = 2 })
	h.prime(t, "a")
	h.next.set("a", hang)
	var outs []<-chan outcomeOf
	for i := range 2 {
		outs = append(outs, h.takeAsync(req(fmt.Sprintf("a:k%d", i), 100, 100)))
		h.waitEntered(t)
	}
	h.waitTimers(t, 4) // each check's wait and its call's deadline
	got, moved := h.advanceUntilAnswered(t, 2, outs...)
	for _, o := range got {
		if o.err != nil || o.res.Source != bucket.SourceFallback {
			t.Fatalf("check past its wait: %+v, %v; want answered locally", o.res, o.err)
		}
	}
	if st := h.s.State("a"); st != Closed {
		t.Fatalf("a: %v before any call's deadline, want closed", st)
	}
	if res := h.take(t, req("a:k2", 100, 100)); res.Source != bucket.SourceFallback {
		t.Fatalf("at MaxInFlight: %v, want answered locally", res.Source)
	}
	h.clk.Advance(DefaultReplyTimeout - moved)
	h.eventually(t, "a open at its calls' deadline", func() bool { return h.s.State("a") == Open })
	if res := h.take(t, req("a:k3", 100, 100)); res.Source != bucket.SourceFallback {
		t.Fatalf("open breaker: %v, want answered locally", res.Source)
	}
	h.prime(t, "b")
	h.next.set("b", down)
	if res := h.take(t, req("b:k", 100, 100)); res.Source != bucket.SourceFallback {
		t.Fatalf("failed call: %v, want answered locally", res.Source)
	}

	h.obs.mu.Lock()
	locals := maps.Clone(h.obs.locals)
	h.obs.mu.Unlock()
	want := map[local]int{{"a", LocalWait}: 2, {"a", LocalBound}: 1, {"a", LocalOpen}: 1, {"b", LocalError}: 1}
	if !maps.Equal(locals, want) {
		t.Errorf("local answers by shard and reason: %v, want %v", locals, want)
	}
	silent := h.silenceLogs()
	if len(silent) != 1 || !strings.Contains(silent[0], "shard=a") || !strings.Contains(silent[0], "another-shard-answered=false") {
		t.Errorf("silence logs: %q, want one, for shard a, saying no other shard answered", silent)
	}
}

// TestSilenceLogSaysAnotherShardAnswered: when another shard answers while a shard is
// silent, the silence's log line says so (the shard, not this host, is the suspect).
func TestSilenceLogSaysAnotherShardAnswered(t *testing.T) {
	h := newHarness(t, nil)
	h.prime(t, "a")
	h.prime(t, "b")
	h.next.set("a", hang)
	out := h.takeAsync(req("a:k", 100, 100))
	h.waitEntered(t)
	h.waitTimers(t, 2)
	h.clk.Advance(DefaultTimeout)
	if res := h.take(t, req("b:k", 100, 100)); res.Source != bucket.SourceRedis {
		t.Fatalf("healthy shard b: %v", res.Source)
	}
	got, _ := h.advanceUntilAnswered(t, 1, out)
	if o := got[0]; o.err != nil || o.res.Source != bucket.SourceFallback {
		t.Fatalf("check past its wait: %+v, %v; want answered locally", o.res, o.err)
	}
	silent := h.silenceLogs()
	if len(silent) != 1 || !strings.Contains(silent[0], "shard=a") || !strings.Contains(silent[0], "another-shard-answered=true") {
		t.Errorf("silence logs: %q, want one, for shard a, saying another shard answered", silent)
	}
}

// silenceLogs returns the log lines of logSilence.
func (h *harness) silenceLogs() []string {
	var silent []string
	for _, l := range h.logs.lines() {
		if strings.Contains(l, "redis shard silent") {
			silent = append(silent, l)
		}
	}
	return silent
}
