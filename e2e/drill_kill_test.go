package e2e

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/e2e/stack"
)

// The drill rule (stack.DrillRules): 100 a second, bursts of 100, globally. Each of the
// stack's three regions enforces its default split, a third (no balancer has moved it).
const (
	drillRate, drillBurst = 100.0, 100.0
	regionShare           = 1.0 / 3
	regionRate            = drillRate * regionShare
	regionBurst           = drillBurst * regionShare

	// drill-lease: 600 a second, bursts of 600, globally; 200 in a region, where each of
	// two enforcers leases batches of 200 / 2 / 10 = 10 tokens.
	leaseRate, leaseBurst = 600 * regionShare, 600 * regionShare
)

// drillEnforcerKilled: one of eu-west's two enforcers is SIGKILLed while it holds leased
// tokens of a busy key that both are serving above its limit. Promise (docs/design.md §6):
// leases err under, never over — tokens are taken from Redis before they are spent, so
// the key's admitted count in the region never exceeds its regional burst + rate ×
// elapsed, in the whole run and in any 1 s window, and the tokens the dead enforcer held
// are simply lost. Judged on the answers from shared counts (stack.Shared); answers a
// starved machine's open breakers gave from local limits are reported beside.
func drillEnforcerKilled(t *testing.T, s *stack.Stack) {
	r := s.Region("eu-west")
	live, victim := r.Enforcers[0], r.Enforcers[1]
	key := fmt.Sprintf("lease-hot-%d", time.Now().UnixNano())
	const rate, d, killAt = 400.0, 8 * time.Second, 2500 * time.Millisecond
	var killed atomic.Bool
	var killedAt atomic.Int64
	done := make(chan []stack.Answer)
	go func() {
		done <- stack.Drive(t, context.Background(), rate, d, 16, func(i int64, at time.Duration) *stack.Call {
			to := live
			if i%2 == 1 && !killed.Load() {
				to = victim
			}
			return &stack.Call{To: to, Req: req("drill-lease", key, ""), Class: "hot"}
		})
	}()
	time.Sleep(killAt)
	victim.Proc.Kill(t)
	killed.Store(true)
	killedAt.Store(int64(killAt))
	answers := <-done

	all := stack.Count(answers, nil)
	before := stack.Count(answers, func(a *stack.Answer) bool { return a.At < killAt })
	after := stack.Count(answers, func(a *stack.Answer) bool { return a.At >= killAt+time.Second })
	// The bucket refills by real time: a loaded machine sends late (Answer.At is when a
	// check was due, Done when it was answered), so the bound runs to the last answer.
	var last time.Duration
	for _, a := range answers {
		last = max(last, a.Done)
	}
	span := last.Seconds()
	bound := leaseBurst + leaseRate*span
	win := stack.MaxWindow(answers, time.Second, stack.Shared)
	shared := stack.Count(answers, stack.Shared)
	local := stack.Count(answers, func(a *stack.Answer) bool { return a.Err == nil && !stack.Shared(a) })
	t.Logf("enforcer killed holding leases: %d checks over %.1f s at %.0f/s of a key limited in this region to %.1f/s (burst %.1f): admitted from shared counts %d (bound burst+rate×t = %.0f, %.1f%% of it), max in any 1 s %d (bound %.0f); admitted in all %d, of which %d by local limits (fallback: %d answers); sources before the kill %v; errors %d (calls in flight to the killed process); after the kill (+1 s) %d admitted in %.1f s = %.1f/s; per second:%s",
		all.Calls, span, rate, leaseRate, leaseBurst, shared.Allowed, bound, 100*float64(shared.Allowed)/bound, win, leaseBurst+leaseRate, all.Allowed, local.Allowed, local.Calls,
		before.Sources, all.Errors, after.Allowed, d.Seconds()-killAt.Seconds()-1, float64(after.Allowed)/(d.Seconds()-killAt.Seconds()-1),
		stack.Timeline(answers, time.Second, nil))
	if before.Sources["lease"] == 0 {
		t.Errorf("no answer came from leased tokens before the kill (sources %v): the drill did not test leases", before.Sources)
	}
	if float64(shared.Allowed) > bound*1.01 {
		t.Errorf("admitted %d from shared counts > burst + rate × %.1f s = %.0f: the key was held over its limit", shared.Allowed, span, bound)
	}
	if local.Calls*2 > all.Calls {
		t.Errorf("%d of %d answers came from local limits (breakers open on a healthy cluster): the drill did not test leases", local.Calls, all.Calls)
	}
	if float64(win) > (leaseBurst+leaseRate)*1.01 {
		t.Errorf("%d admitted in one 1 s window > burst + rate = %.0f", win, leaseBurst+leaseRate)
	}
	if after.Errors > 0 || after.Allowed == 0 {
		t.Errorf("the surviving enforcer after the kill: %d errors, %d admitted; want it answering and admitting", after.Errors, after.Allowed)
	}

	// Leave the stack whole: the killed enforcer comes back with the same command.
	victim.Proc.Start(t)
	victim.WaitReady(t, time.Minute)
	for _, e := range r.Enforcers {
		e.WaitPeers(t, len(r.Enforcers), time.Minute)
	}
}
