package e2e

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/e2e/stack"
)

// TestEnforcerCutDrill: one enforcer cut off from the balancer alone, on real processes
// (docs/design.md §9, "Cut off alone"). A key's shares have settled in eu-west (its
// traffic is there); then eu-west-1's own links to the balancer replicas are cut
// (Options.EnforcerLinks; eu-west-2's reports and every etcd link stay up) while us-east
// starts wanting the key too. The balancer cannot raise us-east before every eu-west
// enforcer acknowledged eu-west's decrease, and eu-west-1 can acknowledge nothing. With a
// staleness period of 60 s that would hold the move for over a minute; instead eu-west-1
// finds itself cut off within a few intervals (its reports unaccepted while eu-west-2's
// are, seen in the region's Redis), fences itself (min(share, default),
// allot_shares_cut_off), marks itself, and the leader releases it on the mark. Promises:
// eu-west-1 fenced well before it would be stale; us-east's share raised well before the
// staleness period; never over — no published set sums above 1, and the keys admitted
// from shared counts stay within the global limit over 1 s and 5 s windows; once the links
// are back eu-west-1 rejoins (no longer cut off, its reports accepted).
func TestEnforcerCutDrill(t *testing.T) {
	start := time.Now()
	opt := stack.DefaultOptions()
	opt.Balancers = 1
	opt.BalanceInterval = 2 * time.Second
	opt.SessionTTL = 4 * time.Second
	opt.ShareStale = 60 * time.Second
	opt.EnforcerLinks = true
	s := stack.Start(t, opt)
	t.Logf("enforcer cut: stack up in %v", time.Since(start).Round(time.Millisecond))
	sums := watchShareSums(t, s)

	us, eu := s.Region("us-east"), s.Region("eu-west")
	cutOff := eu.Enforcers[0]
	if len(cutOff.BalancerLinks) == 0 {
		t.Fatalf("%s has no links of its own to the balancer", cutOff.ID)
	}
	key := fmt.Sprintf("enforcercut-%d", time.Now().UnixNano())
	identity := "key:" + key
	// eu-west offers 400/s throughout (half to each enforcer), us-east 300/s from the cut
	// on; the global limit is 300/s.
	const euRate, usRate = 400.0, 300.0
	// The cut comes once the key has settled in eu-west, 10 to 30 s in; the load goes on
	// for 50 s after it.
	const cutFor, after = 30 * time.Second, 50 * time.Second
	const interval, stale = 2 * time.Second, 60 * time.Second
	load := driveIntoUS(t, eu, us, key, euRate, usRate, 30*time.Second+after)
	began := load.began
	cutAt, last := load.cutWhenSettled(t, sums, identity, "eu-west", 10*time.Second, 30*time.Second)
	d := cutAt + after
	cut := time.Now()
	restore := cutLinks(t, cutOff.BalancerLinks)
	defer restore()
	t.Logf("enforcer cut: %s's %d balancer links cut %v into the run; the key's shares before: us-east %.2f, eu-west %.2f, ap-south %.2f",
		cutOff.ID, len(cutOff.BalancerLinks), cut.Sub(began).Round(time.Millisecond), last["us-east"], last["eu-west"], last["ap-south"])

	// While cut: when eu-west-1 fences itself (and whether it ever goes stale: it must not,
	// well within the staleness period).
	var fencedAt, staleAt time.Duration
	for time.Since(cut) < cutFor {
		if m, err := metricsNow(cutOff); err == nil {
			if fencedAt == 0 && m.Sum("allot_shares_cut_off") == 1 {
				fencedAt = time.Since(cut)
			}
			if staleAt == 0 && m.Sum("allot_shares_stale") == 1 {
				staleAt = time.Since(cut)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	restore()
	back := time.Now()
	var rejoined time.Duration
	for time.Since(back) < 30*time.Second && rejoined == 0 {
		if m, err := metricsNow(cutOff); err == nil && m.Sum("allot_shares_cut_off") == 0 &&
			m.Sum("allot_usage_last_report_timestamp_seconds") > float64(back.UnixNano())/1e9 {
			rejoined = time.Since(back)
		}
		time.Sleep(100 * time.Millisecond)
	}
	answers := load.end(d)
	n, worstSum := sums.stop()

	// 1. Fenced within a few intervals (CutOffAfter unaccepted while a region-mate was
	// heard, then the next report's look at the region's Redis), never stale.
	t.Logf("enforcer cut: %s fenced itself %v after the cut (stale: %v), rejoined %v after the restore",
		cutOff.ID, fencedAt.Round(10*time.Millisecond), staleAt.Round(10*time.Millisecond), rejoined.Round(10*time.Millisecond))
	if fencedAt == 0 {
		t.Errorf("%s never fenced itself in the %v it was cut off alone", cutOff.ID, cutFor)
	} else if fencedAt > 6*interval {
		t.Errorf("%s fenced itself %v after the cut, want within %v (a few intervals; the staleness period is %v)", cutOff.ID, fencedAt, 6*interval, stale)
	}
	if staleAt != 0 {
		t.Errorf("%s went stale %v after the cut, before the staleness period (%v)", cutOff.ID, staleAt, stale)
	}
	if rejoined == 0 {
		t.Errorf("%s still cut off (or no report accepted) 30 s after its links were restored", cutOff.ID)
	}

	// 2. The move: us-east's share raised once the leader released eu-west-1 on its mark,
	// long before the staleness period would have.
	var moved time.Duration
	var line strings.Builder
	for _, set := range sums.Sets() {
		if set.at.Before(cut) {
			continue
		}
		sh := sharesOf(set, identity)
		since := set.at.Sub(cut)
		fmt.Fprintf(&line, " +%.1fs v%d %s;", since.Seconds(), set.version, fmtShares([]string{"us-east", "eu-west", "ap-south"}, sh))
		if moved == 0 && set.at.Before(back) && sh["us-east"] >= last["us-east"]+0.15 {
			moved = since
		}
	}
	t.Logf("enforcer cut: sets published for the key after the cut (time after it):%s", line.String())
	t.Logf("enforcer cut: us-east's share raised %v after the cut; %d sets read, largest sum %.4f", moved.Round(10*time.Millisecond), n, worstSum)
	if moved == 0 {
		t.Errorf("us-east's share never rose in the %v eu-west-1 was cut off: the leader waited for its acknowledgement", cutFor)
	} else if moved > stale/2 {
		t.Errorf("us-east's share rose %v after the cut, want well within the staleness period (%v): eu-west-1 was not released on its mark", moved, stale)
	}
	if worstSum > 1+1e-9 {
		t.Errorf("a published share vector summed to %.6f > 1", worstSum)
	}

	// 3. Never over on what was admitted.
	shared := sharedAnswers(answers)
	all := stack.Count(answers, nil)
	s1, s5 := maxWindowRatio(shared, time.Second, shiftRate, shiftBurst), maxWindowRatio(shared, 5*time.Second, shiftRate, shiftBurst)
	ps := perSecond(shared, regionOf(s), d)
	t.Logf("enforcer cut: %d checks, %d errors, %d answers not from shared counts; admitted per second (cut at %d, restored at %d): eu-west %v, us-east %v; max window ratio 1 s %.3f, 5 s %.3f",
		all.Calls, all.Errors, all.Calls-int64(len(shared)), int(cutAt/time.Second), int((cutAt+cutFor)/time.Second), ps["eu-west"], ps["us-east"], s1, s5)
	if all.Errors > 0 {
		t.Errorf("%d checks failed (first %v)", all.Errors, all.FirstErr)
	}
	if int64(len(shared))*2 < all.Calls {
		t.Errorf("only %d of %d answers from shared counts: the drill did not test the shares", len(shared), all.Calls)
	}
	if s1 > 1.01 || s5 > 1.01 || math.IsNaN(s1) {
		t.Errorf("global admitted from shared counts above the limit: max window ratio %.3f (1 s), %.3f (5 s), want ≤ 1.01", s1, s5)
	}
	usAfter := avg(ps["us-east"], int((cutAt+moved)/time.Second)+3, int((cutAt+cutFor)/time.Second))
	t.Logf("enforcer cut: us-east admitted %.0f/s once its share was raised", usAfter)
}
