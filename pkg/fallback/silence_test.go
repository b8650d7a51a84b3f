package fallback

import (
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// Tests of the cross-shard rule (Config.AllSilentFor, at its default 500 ms): a missing
// reply opens its shard's breaker at ReplyTimeout when another shard answered a call sent
// after it, and only after every shard has been silent for AllSilentFor when none did.

func newSilenceHarness(t *testing.T) *harness {
	return newHarness(t, func(c *Config) { c.AllSilentFor = DefaultAllSilentFor })
}

// hangWhileAnswered makes a check for key hung that gets no reply, then, 1 ms later, one
// for key ok that Redis answers, and lets the first run to ReplyTimeout; it returns once
// the first is done.
func (h *harness) hangWhileAnswered(t *testing.T, hung, ok string) {
	t.Helper()
	h.next.set(hung, hang)
	out := h.takeAsync(req(hung, 100, 100))
	h.waitEntered(t)
	h.waitTimers(t, 2)
	h.clk.Advance(time.Millisecond)
	if res := h.take(t, req(ok, 100, 100)); res.Source != bucket.SourceRedis {
		t.Fatalf("healthy key %s: %v", ok, res.Source)
	}
	h.clk.Advance(DefaultReplyTimeout)
	<-out
}

// hangRound makes one check on each of shards, all hanging, and lets their calls run to
// ReplyTimeout; it returns once every call is done.
func (h *harness) hangRound(t *testing.T, shards ...string) {
	t.Helper()
	var outs []<-chan outcomeOf
	for _, sh := range shards {
		outs = append(outs, h.takeAsync(req(sh+":k", 100, 100)))
		h.waitEntered(t)
	}
	h.waitTimers(t, 2*len(shards)) // each check's wait and its call's deadline
	got, moved := h.advanceUntilAnswered(t, len(shards), outs...)
	for _, o := range got {
		if o.err != nil || o.res.Source != bucket.SourceFallback {
			t.Fatalf("check past its wait: %+v, %v; want answered locally", o.res, o.err)
		}
	}
	h.clk.Advance(DefaultReplyTimeout - moved)
	for _, sh := range shards {
		h.eventually(t, sh+"'s call done", func() bool { return h.s.breakerFor(sh+":").inFlight.Load() == 0 })
	}
}

// TestSilentShardWhilePeersAnswerTrips: shard a hangs while shard b answers a call sent
// after a's: that is evidence against a, which opens at ReplyTimeout; b stays closed.
func TestSilentShardWhilePeersAnswerTrips(t *testing.T) {
	h := newSilenceHarness(t)
	h.prime(t, "a")
	h.prime(t, "b")
	h.hangWhileAnswered(t, "a:k", "b:k")
	h.eventually(t, "a open at ReplyTimeout", func() bool { return h.s.State("a") == Open })
	if st := h.s.State("b"); st != Closed {
		t.Fatalf("b: %v, want closed", st)
	}
}

// TestAllShardsSilentTogether: every shard stops answering at once (as when this
// process's reads are starved). No breaker opens while the last reply from any shard is
// under AllSilentFor old; the first missing reply after that opens them: a whole cluster
// down trips in about AllSilentFor.
func TestAllShardsSilentTogether(t *testing.T) {
	h := newSilenceHarness(t)
	h.prime(t, "a")
	h.prime(t, "b") // the last reply; now is ReplyTimeout after it
	h.next.set("a", hang)
	h.next.set("b", hang)
	last := h.clk.Now().Add(-DefaultReplyTimeout)
	for round := 1; ; round++ {
		h.hangRound(t, "a", "b")
		silent := h.clk.Now().Sub(last)
		open := h.s.State("a") == Open && h.s.State("b") == Open
		if silent < DefaultAllSilentFor {
			if h.s.State("a") != Closed || h.s.State("b") != Closed || h.obs.failureCount() != 0 {
				t.Fatalf("round %d, every shard silent for %v: a %v, b %v, %d failures; want both closed",
					round, silent, h.s.State("a"), h.s.State("b"), h.obs.failureCount())
			}
			continue
		}
		if !open {
			t.Fatalf("every shard silent for %v: a %v, b %v; want both open", silent, h.s.State("a"), h.s.State("b"))
		}
		if silent > DefaultAllSilentFor+DefaultReplyTimeout {
			t.Fatalf("opened after %v of silence, want within AllSilentFor + one call", silent)
		}
		break
	}
}

// TestDeadSinceStartTrips: a cluster that never answered trips at ReplyTimeout: there is
// no reply to wait for, and no stall to blame.
func TestDeadSinceStartTrips(t *testing.T) {
	h := newSilenceHarness(t)
	h.next.set("a", hang)
	h.next.set("b", hang)
	out := h.takeAsync(req("a:k", 100, 100))
	h.waitEntered(t)
	h.waitTimers(t, 2)
	h.clk.Advance(DefaultReplyTimeout)
	<-out
	h.eventually(t, "a open at ReplyTimeout", func() bool { return h.s.State("a") == Open })
}

func TestAllSilentForValidated(t *testing.T) {
	c := DefaultConfig()
	c.AllSilentFor = c.ReplyTimeout - time.Millisecond
	if err := c.Validate(); err == nil {
		t.Fatal("AllSilentFor < ReplyTimeout accepted")
	}
}
