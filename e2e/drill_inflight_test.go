package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/allot-dev/allot/e2e/stack"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// drill-inflight (stack.DrillRules): 9 in flight at once globally, each slot coming back
// 3 s after it was taken without a release; each region holds floor(9 × 1/3) = 3.
const (
	inflightRegionCap = 3
	inflightTimeout   = 3 * time.Second
)

// drillEnforcerKilledInflight: one of ap-south's two enforcers is SIGKILLed while it holds
// every in-flight slot of a key (issue 22 §1). Promise (docs/design.md §7, README
// "In-flight limits"): the slots are held on the key's shard, not in the process, so the
// survivor refuses the next acquire at once (the dead process's slots still count), and
// a lost release heals itself: within the timeout (+ a small bound for the poll and a
// starved machine) the key admits its cap again.
func drillEnforcerKilledInflight(t *testing.T, s *stack.Stack) {
	r := s.Region("ap-south")
	live, victim := r.Enforcers[0], r.Enforcers[1]
	key := fmt.Sprintf("inflight-%d", time.Now().UnixNano())
	ctx := context.Background()
	check := func(e *stack.Enforcer) (allowed bool, handle string) {
		t.Helper()
		resp, err := e.Check(t, ctx, req("drill-inflight", key, ""))
		if err != nil {
			t.Fatalf("check at %s: %v", e.ID, err)
		}
		if resp.GetAllowed() && resp.GetHandle() == "" {
			t.Fatalf("check at %s allowed without a handle: the rule held no slot (%v)", e.ID, resp)
		}
		return resp.GetAllowed(), resp.GetHandle()
	}

	// The victim takes every slot of the key and never releases them.
	took := time.Now()
	for i := range inflightRegionCap {
		if ok, _ := check(victim); !ok {
			t.Fatalf("acquire %d of %d at %s refused: the region's cap is %d", i+1, inflightRegionCap, victim.ID, inflightRegionCap)
		}
	}
	heldFor := time.Since(took)
	victim.Proc.Kill(t)
	killed := time.Now()

	// The survivor refuses the next one at once: the slots are on the shard.
	resp, err := live.Check(t, ctx, req("drill-inflight", key, ""))
	if err != nil {
		t.Fatalf("check at %s after the kill: %v", live.ID, err)
	}
	if resp.GetAllowed() {
		t.Errorf("acquire %d at %s right after the kill allowed (source %v): the dead enforcer's slots were not counted", inflightRegionCap+1, live.ID, resp.GetSource())
	}
	if resp.GetRule() != "drill-inflight" {
		t.Errorf("refusal names rule %q, want drill-inflight", resp.GetRule())
	}

	// Within the timeout plus a small bound, the slots come back (each timeout after its
	// own acquire): the survivor admits the whole cap again. Poll every 50 ms, keeping
	// what is admitted, until the cap is held.
	const slack = 1500 * time.Millisecond
	deadline := took.Add(heldFor + inflightTimeout + slack)
	var first, all time.Time
	var handles []string
	for len(handles) < inflightRegionCap && time.Now().Before(deadline) {
		if ok, h := check(live); ok {
			if first.IsZero() {
				first = time.Now()
			}
			handles = append(handles, h)
			continue
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(handles) == inflightRegionCap {
		all = time.Now()
		if ok, _ := check(live); ok {
			t.Errorf("acquire %d after the slots came back allowed: the cap is %d", inflightRegionCap+1, inflightRegionCap)
		}
	}
	for _, h := range handles {
		if _, err := live.Client(t).Release(ctx, &allotv1.ReleaseRequest{Handle: h}); err != nil {
			t.Errorf("release: %v", err)
		}
	}
	if all.IsZero() {
		t.Fatalf("%d of the dead enforcer's %d slots back within the timeout %v + %v of their acquire", len(handles), inflightRegionCap, inflightTimeout, slack)
	}
	// Slots are stamped with Redis's clock when the script runs, after took: allow the
	// clocks of the test and the container a little.
	if early := first.Sub(took); early < inflightTimeout-200*time.Millisecond {
		t.Errorf("a slot came back %v after the first acquire, before the timeout %v: it was not held", early, inflightTimeout)
	}
	t.Logf("enforcer killed holding %d in-flight slots (timeout %v, taken in %v): the survivor refused acquire %d at once; the first slot came back %v after the first acquire (%v after the kill), all %d %v after it",
		inflightRegionCap, inflightTimeout, heldFor.Round(time.Millisecond), inflightRegionCap+1, first.Sub(took).Round(time.Millisecond), first.Sub(killed).Round(time.Millisecond), inflightRegionCap, all.Sub(took).Round(time.Millisecond))

	// Leave the stack whole: the killed enforcer comes back with the same command.
	victim.Proc.Start(t)
	victim.WaitReady(t, time.Minute)
	for _, e := range r.Enforcers {
		e.WaitPeers(t, len(r.Enforcers), time.Minute)
	}
}
