package fallback

import (
	"fmt"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// Tests that this process being slow never opens a breaker on a healthy shard: replies
// later than a check's wait, a stall across a call's deadline, a caller woken late.

// TestLateRepliesDoNotTrip: a healthy shard whose replies arrive 20–30 ms late (this
// process slow to read them) never opens; once it has answered, checks keep waiting for
// its answers instead of taking local ones.
func TestLateRepliesDoNotTrip(t *testing.T) {
	h := newHarness(t, nil)
	h.next.set("a", late)
	for round, d := range []time.Duration{20 * time.Millisecond, 30 * time.Millisecond, 25 * time.Millisecond} {
		h.next.delay = d
		const n = 8
		var outs []<-chan outcomeOf
		for i := 0; i < n; i++ {
			outs = append(outs, h.takeAsync(req(fmt.Sprintf("a:k%d", i), 1000, 1000)))
			h.waitEntered(t)
		}
		h.waitTimers(t, 3*n) // per check: its wait, its call's deadline, the late reply
		for step := time.Duration(0); step < d; step += time.Millisecond {
			h.clk.Advance(time.Millisecond)
		}
		for i, out := range outs {
			o := <-out
			if o.err != nil {
				t.Fatal(o.err)
			}
			// The first round: a shard never heard from may be dialling, so its checks
			// wait; later rounds see the shard alive (it answered within ReplyTimeout/2).
			if o.res.Source != bucket.SourceRedis {
				t.Errorf("round %d check %d: answered from %v, want the late redis answer", round, i, o.res.Source)
			}
		}
		h.eventually(t, "calls done", func() bool { return h.s.breakerFor("a:").inFlight.Load() == 0 })
		if st := h.s.State("a"); st != Closed {
			t.Fatalf("round %d: replies %v late opened the breaker: %v", round, d, st)
		}
	}
	if n := h.obs.failureCount(); n != 0 {
		t.Fatalf("%d failures counted for late replies", n)
	}
}

// TestStallAcrossDeadlineDoesNotTrip: this process stalls (every timer fires at once, late)
// across a call's ReplyTimeout. The missing reply proves nothing about the shard.
func TestStallAcrossDeadlineDoesNotTrip(t *testing.T) {
	h := newHarness(t, nil)
	h.next.set("a", hang)
	out := h.takeAsync(req("a:k", 100, 100))
	h.waitEntered(t)
	h.waitTimers(t, 2)
	h.clk.Advance(DefaultReplyTimeout + DefaultReplyTimeout/2 + time.Millisecond) // one 151 ms stall
	if o := <-out; o.err != nil || o.res.Source != bucket.SourceFallback {
		t.Fatalf("check across the stall: %+v, %v; want answered locally", o.res, o.err)
	}
	h.eventually(t, "call done", func() bool { return h.s.breakerFor("a:").inFlight.Load() == 0 })
	if st := h.s.State("a"); st != Closed || h.obs.failureCount() != 0 {
		t.Fatalf("a stall across the deadline: %v with %d failures, want closed, none", st, h.obs.failureCount())
	}
	// The same missing reply seen on time is evidence: it opens.
	out = h.takeAsync(req("a:k", 100, 100))
	h.waitEntered(t)
	h.waitTimers(t, 2)
	h.clk.Advance(DefaultReplyTimeout)
	<-out
	h.eventually(t, "breaker open", func() bool { return h.s.State("a") == Open })
}

// TestAliveShardAnsweredAfterMissingReply: a call that gets no reply does not open the
// breaker when the shard answered a call sent after it.
func TestAliveShardAnsweredAfterMissingReply(t *testing.T) {
	h := newHarness(t, nil)
	h.hangWhileAnswered(t, "a:stuck", "a:ok")
	h.eventually(t, "call done", func() bool { return h.s.breakerFor("a:").inFlight.Load() == 0 })
	if st := h.s.State("a"); st != Closed {
		t.Fatalf("one lost reply on a shard answering others opened it: %v", st)
	}
}

// TestCallerWokenLateKeepsWaiting: the checking goroutine's wait ends a whole Timeout
// late (it was not scheduled); the answer may be in, so it waits once more and uses it.
func TestCallerWokenLateKeepsWaiting(t *testing.T) {
	h := newHarness(t, nil)
	h.next.set("a", hold)
	out := h.takeAsync(req("a:k", 100, 100))
	h.waitEntered(t)
	h.waitTimers(t, 2)
	h.clk.Advance(3 * DefaultTimeout) // the wait fires 10 ms late
	h.waitTimers(t, 2)                // it waits again (its new timer, the call's deadline)
	h.next.release <- struct{}{}
	if o := <-out; o.err != nil || o.res.Source != bucket.SourceRedis {
		t.Fatalf("late-woken check: %+v, %v; want the redis answer", o.res, o.err)
	}
}

// TestInFlightIsBounded: a shard holding MaxInFlight unanswered calls gets no more; its
// checks are answered locally at once. Close cancels the calls and waits for them.
func TestInFlightIsBounded(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxInFlight = 3 })
	h.prime(t, "a")
	h.next.set("a", hang)
	for i := 0; i < 3; i++ {
		out := h.takeAsync(req("a:k", 100, 100))
		h.waitEntered(t)
		h.waitTimers(t, i+2) // the deadlines of earlier calls, and this one's wait and deadline
		h.advanceUntilAnswered(t, i+1, out)
	}
	calls := h.next.callsTo("a")
	for i := 0; i < 50; i++ {
		if res := h.take(t, req("a:k", 100, 100)); res.Source != bucket.SourceFallback {
			t.Fatalf("at the bound: %v", res.Source)
		}
	}
	if n := h.next.callsTo("a"); n != calls {
		t.Fatalf("%d calls past MaxInFlight", n-calls)
	}
	if err := h.s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := h.s.breakerFor("a:").inFlight.Load(); n != 0 {
		t.Fatalf("Close returned with %d calls in flight", n)
	}
}

// TestMeter: a gap between ticks over the threshold marks a stall that ended then; a
// stall under way (no recent tick) counts too.
func TestMeter(t *testing.T) {
	m := meter{gap: 25_000}
	if m.stalledSince(0, 1_000_000) {
		t.Fatal("a meter that never ticked claims a stall")
	}
	for now := int64(1_000_000); now <= 1_100_000; now += 5_000 {
		m.tick(now)
	}
	for _, tc := range []struct {
		sent, now int64
		want      bool
	}{
		{1_000_000, 1_100_000, false}, // ticking on time
		{1_000_000, 1_120_000, false}, // 20 ms since the last tick: under the gap
		{1_000_000, 1_130_001, true},  // 30 ms without a tick: stalled now
	} {
		if got := m.stalledSince(tc.sent, tc.now); got != tc.want {
			t.Errorf("stalledSince(%d, %d) = %v, want %v", tc.sent, tc.now, got, tc.want)
		}
	}
	m.tick(1_160_000) // a 60 ms gap ends at 1.16 s
	if !m.stalledSince(1_050_000, 1_160_000) {
		t.Error("a call sent before the stall ended: not marked")
	}
	m.tick(1_165_000)
	if m.stalledSince(1_161_000, 1_165_000) {
		t.Error("a call sent after the stall ended: marked")
	}
}

// TestFailClosedWaitsForTheReply: a fail-closed check whose reply is late (20 ms) on a
// shard last heard from long ago is answered by the reply, not refused after its 5 ms
// wait: a refusal must come from evidence about the shard, never from this process's
// slowness.
func TestFailClosedWaitsForTheReply(t *testing.T) {
	h := newHarness(t, nil)
	h.take(t, req("a:warm", 1000, 1000)) // the shard has answered once...
	h.clk.Advance(time.Second)           // ...long ago
	h.next.set("a", late)
	h.next.delay = 20 * time.Millisecond
	r := req("a:login", 1000, 1000)
	r.FailClosed = true
	out := h.takeAsync(r)
	h.waitEntered(t)
	h.waitTimers(t, 3) // the wait, the call's deadline, the late reply
	for step := time.Duration(0); step < h.next.delay; step += time.Millisecond {
		h.clk.Advance(time.Millisecond)
	}
	if o := <-out; o.err != nil || o.res.Source != bucket.SourceRedis || !o.res.Allowed() {
		t.Fatalf("fail-closed check with a 20 ms reply: %+v, %v; want the redis grant", o.res, o.err)
	}
	if st := h.s.State("a"); st != Closed {
		t.Fatalf("breaker %v, want closed", st)
	}
}

// TestIdleShardLateReplyIsUsed: a shard with little traffic, last heard from a second ago
// (it had nothing to answer), replies 20 ms late. Its silence counts from when it was given
// the call, not from its last reply, so the check waits for the reply instead of being
// answered locally at its 5 ms wait.
func TestIdleShardLateReplyIsUsed(t *testing.T) {
	h := newHarness(t, nil)
	h.take(t, req("a:warm", 1000, 1000))
	h.clk.Advance(time.Second)
	h.next.set("a", late)
	h.next.delay = 20 * time.Millisecond
	out := h.takeAsync(req("a:k", 1000, 1000))
	h.waitEntered(t)
	h.waitTimers(t, 3) // the wait, the call's deadline, the late reply
	h.clk.Advance(DefaultTimeout)
	// The wait fired on time: the check answers now (locally) or waits again.
	h.eventually(t, "the check answered or waits again", func() bool { return len(out) > 0 || h.clk.Timers() >= 3 })
	h.clk.Advance(h.next.delay - DefaultTimeout)
	if o := <-out; o.err != nil || o.res.Source != bucket.SourceRedis {
		t.Fatalf("check on an idle shard with a 20 ms reply: %+v, %v; want the redis answer", o.res, o.err)
	}
}
