package e2e

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/e2e/stack"
	"github.com/allot-dev/allot/pkg/testenv"
)

// drillRegionCut: a key's shares have settled in eu-west (its traffic is there); then
// eu-west is cut off from etcd and from the balancer at once (every one of its etcd links
// and balancer links, stack.Region.BalancerLinks: its enforcers report through
// balancer.addrs) while us-east starts wanting the key too. Promises (docs/design.md §9, issue
// 11): eu-west keeps enforcing its last share until the staleness period has passed
// (pkg/enforcer/overrides: no refresh and no accepted report for that long), then min(last, default);
// the balancer holds the silent region at its last share until the same period has
// passed and only then hands the rest to us-east, so what eu-west enforces on its own plus
// what the others are given never sums above 1; once the links are back, eu-west's
// reports are accepted again, it is no longer stale, and its share moves again.
func drillRegionCut(t *testing.T, s *stack.Stack, sums *shareSums) {
	us, eu := s.Region("us-east"), s.Region("eu-west")
	if len(eu.BalancerLinks) == 0 {
		t.Fatal("eu-west has no balancer links: its reports cannot be cut alone")
	}
	key := fmt.Sprintf("regioncut-%d", time.Now().UnixNano())
	identity := "key:" + key
	// eu-west offers 400/s throughout, us-east 300/s from the cut on (the global limit is
	// 300/s).
	const euRate, usRate = 400.0, 300.0
	// The cut comes once the key has settled in eu-west, 10 to 30 s in; the load goes on
	// for 40 s after it.
	const cutFor, tail = 20 * time.Second, 40 * time.Second
	const stale, interval = 12 * time.Second, 2 * time.Second
	load := driveIntoUS(t, eu, us, key, euRate, usRate, 30*time.Second+tail)
	began := load.began
	// What eu-west was given before the cut: the last set published for the key.
	cutAt, last := load.cutWhenSettled(t, sums, identity, "eu-west", 10*time.Second, 30*time.Second)
	d := cutAt + tail
	held := math.Min(last["eu-west"], regionShare) // what it may enforce once stale
	cut := time.Now()
	restore := cutLinks(t, append(append([]*testenv.Link(nil), eu.EtcdLinks...), eu.BalancerLinks...))
	defer restore()
	t.Logf("region cut: eu-west's %d etcd links and %d balancer links cut %v into the run; its share of %s before: %.2f (us-east %.2f, ap-south %.2f)",
		len(eu.EtcdLinks), len(eu.BalancerLinks), cut.Sub(began).Round(time.Millisecond), identity, last["eu-west"], last["us-east"], last["ap-south"])

	// While cut: when does each eu-west enforcer go stale? Once stale, each marks itself
	// fenced in eu-west's Redis at every report it tries (pkg/bucket.Fences) and counts
	// the marks (allot_usage_fenced_seen).
	staleAt := map[string]time.Duration{}
	seenCut := map[string]float64{}
	for time.Since(cut) < cutFor {
		for _, e := range eu.Enforcers {
			m, err := metricsNow(e)
			if err != nil {
				continue
			}
			seenCut[e.ID] = max(seenCut[e.ID], m.Sum("allot_usage_fenced_seen"))
			if _, ok := staleAt[e.ID]; !ok && m.Sum("allot_shares_stale") == 1 {
				staleAt[e.ID] = time.Since(cut)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	restore()
	back := time.Now()

	// After the restore: reports accepted again, no longer stale, and the share moves.
	accepted, fresh, unmarked := map[string]time.Duration{}, map[string]time.Duration{}, map[string]time.Duration{}
	for time.Since(back) < 30*time.Second && (len(accepted) < len(eu.Enforcers) || len(fresh) < len(eu.Enforcers) || len(unmarked) < len(eu.Enforcers)) {
		for _, e := range eu.Enforcers {
			m, err := metricsNow(e)
			if err != nil {
				continue
			}
			if _, ok := unmarked[e.ID]; !ok && len(fresh) == len(eu.Enforcers) && m.Sum("allot_usage_fenced_seen") == 0 {
				unmarked[e.ID] = time.Since(back)
			}
			if _, ok := accepted[e.ID]; !ok && m.Sum("allot_usage_last_report_timestamp_seconds") > float64(back.UnixNano())/1e9 {
				accepted[e.ID] = time.Since(back)
			}
			if _, ok := fresh[e.ID]; !ok && m.Sum("allot_shares_stale") == 0 {
				fresh[e.ID] = time.Since(back)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	answers := load.end(d)
	shared := sharedAnswers(answers)
	ps := perSecond(shared, regionOf(s), d)
	all := stack.Count(answers, nil)
	k0, k1 := int(cutAt/time.Second), int((cutAt+cutFor)/time.Second)
	t.Logf("region cut: admitted per second from shared counts (cut at second %d, restored at %d): eu-west %v, us-east %v; %d checks, %d errors, %d answers not from shared counts",
		k0, k1, ps["eu-west"], ps["us-east"], all.Calls, all.Errors, all.Calls-int64(len(shared)))
	if all.Errors > 0 {
		t.Errorf("%d checks failed (first %v): a cut region's checks must keep being answered", all.Errors, all.FirstErr)
	}
	if int64(len(shared))*2 < all.Calls {
		t.Errorf("only %d of %d answers from shared counts: the drill did not test the shares", len(shared), all.Calls)
	}

	// 1. eu-west stale after the staleness period, not before: its last accepted report
	// and its last refresh were at most one interval before the cut. Behind an aggregator
	// (TestAggregatedDrills) the leader confirms an enforcer as of the report the last
	// forward carried, up to one interval more before the cut: it may fence that much
	// earlier (errs safe), never later.
	early := interval + time.Second
	if len(s.Aggregators) > 0 {
		early += interval
	}
	var latest time.Duration
	for _, e := range eu.Enforcers {
		at, ok := staleAt[e.ID]
		if !ok {
			t.Errorf("%s never went stale in the %v it was cut off (staleness period %v)", e.ID, cutFor, stale)
			at = cutFor
		} else if at < stale-early || at > stale+2*time.Second {
			t.Errorf("%s went stale %v after the cut, want within [%v, %v] (staleness period %v, reports and refreshes every %v)",
				e.ID, at.Round(time.Millisecond), stale-early, stale+2*time.Second, stale, interval)
		}
		latest = max(latest, at)
	}
	t.Logf("region cut: eu-west's enforcers stale (min(last, default) = %.2f) after %v", held, roundAll(staleAt))

	// 2. What eu-west enforced on its own: its last share until stale, then min(last,
	// default). Judged on whole seconds clear of the transitions.
	earliest := latest
	for _, at := range staleAt {
		earliest = min(earliest, at)
	}
	keep := avg(ps["eu-west"], k0+1, k0+int(earliest/time.Second))
	after := avg(ps["eu-west"], k0+int(latest/time.Second)+2, k1)
	t.Logf("region cut: eu-west admitted %.0f/s while cut and not stale (its last share %.2f × %.0f = %.0f/s), %.0f/s once stale (min(last, default) × limit = %.0f/s)",
		keep, last["eu-west"], shiftRate, last["eu-west"]*shiftRate, after, held*shiftRate)
	if keep < 0.8*last["eu-west"]*shiftRate {
		t.Errorf("cut off but not yet stale, eu-west admitted %.0f/s, want ≥ 80%% of its last share (%.0f/s): it must keep enforcing its last shares", keep, last["eu-west"]*shiftRate)
	}
	if after > 1.1*held*shiftRate || after < 0.7*held*shiftRate {
		t.Errorf("stale, eu-west admitted %.0f/s, want about min(last, default) × limit = %.0f/s (within −30%%/+10%%)", after, held*shiftRate)
	}

	// 3. The balancer: eu-west held at its last share until the staleness period, then
	// min(last, default); the rest to us-east; had eu-west only been cut off (it is),
	// what it enforces plus the others' never above 1.
	var gone, moved time.Duration
	worst := 0.0
	var line strings.Builder
	for _, set := range sums.Sets() {
		if set.at.Before(cut) {
			continue
		}
		sh := sharesOf(set, identity)
		since := set.at.Sub(cut)
		fmt.Fprintf(&line, " +%.1fs v%d %s;", since.Seconds(), set.version, fmtShares([]string{"us-east", "eu-west", "ap-south"}, sh))
		if set.at.Before(back) {
			euHeld := last["eu-west"] // what eu-west enforces, by the stale times measured
			if since >= latest {
				euHeld = held
			}
			worst = math.Max(worst, sh["us-east"]+euHeld+sh["ap-south"])
			if gone == 0 && sh["eu-west"] <= held+1e-6 {
				gone = since
			}
		} else if moved == 0 && sh["eu-west"] > held+0.05 {
			moved = set.at.Sub(back)
		}
	}
	t.Logf("region cut: sets published for the key after the cut (time after it):%s", line.String())
	t.Logf("region cut: the balancer treated eu-west as gone (its share ≤ min(last, default) = %.2f) %v after the cut; largest sum had eu-west only been cut off %.4f",
		held, gone.Round(time.Millisecond), worst)
	if gone == 0 {
		t.Errorf("the balancer never lowered silent eu-west to min(last, default) = %.2f in the %v it was cut off", held, cutFor)
	} else if gone < stale-early {
		t.Errorf("the balancer lowered eu-west %v after the cut, before the staleness period (%v): eu-west was still enforcing its last share", gone, stale)
	}
	if worst > 1+1e-9 {
		t.Errorf("what eu-west enforced on its own plus the others' shares summed to %.4f > 1", worst)
	}
	usAfter := avg(ps["us-east"], k0+int(gone/time.Second)+3, k1)
	t.Logf("region cut: us-east admitted %.0f/s once eu-west was treated as gone (the rest, 1 − %.2f − ap-south's, of the limit)", usAfter, held)

	// 4. The marks in eu-west's Redis: each stale enforcer marked itself and counted both
	// (a region-mate's report carries the count, so a balancer that still heard one of
	// them would keep eu-west's default share reserved); once fresh they take the marks
	// back.
	t.Logf("region cut: eu-west's enforcers counted %v fenced in their Redis while cut; none %v after the restore", seenCut, roundAll(unmarked))
	for _, e := range eu.Enforcers {
		if seenCut[e.ID] != float64(len(eu.Enforcers)) {
			t.Errorf("%s counted %v enforcers marked fenced while cut, want %d (every stale one marks itself)", e.ID, seenCut[e.ID], len(eu.Enforcers))
		}
		if _, ok := unmarked[e.ID]; !ok {
			t.Errorf("%s still counts fenced enforcers 30 s after the restore: the marks were not taken back", e.ID)
		}
	}

	// 5. Rejoin: reports accepted, fresh again, the share moves again.
	t.Logf("region cut: after the restore, reports accepted again after %v, not stale after %v, eu-west's share raised again %v after",
		roundAll(accepted), roundAll(fresh), moved.Round(time.Millisecond))
	for _, e := range eu.Enforcers {
		if _, ok := accepted[e.ID]; !ok {
			t.Errorf("%s: no report accepted within 30 s of the restore", e.ID)
		}
		if _, ok := fresh[e.ID]; !ok {
			t.Errorf("%s: still stale 30 s after the restore", e.ID)
		}
	}
	if moved == 0 {
		t.Errorf("eu-west's share never rose above min(last, default) = %.2f after the restore (it offers %.0f/s): it did not rejoin", held, euRate)
	}
	t.Logf("region cut: eu-west admitted per second from shared counts after the restore: %v", ps["eu-west"][k1:])
}

// cutLinks cuts links and returns what restores them: once, and nothing after that (a
// drill restores them when its fault ends and defers the same call for when it fails).
func cutLinks(t *testing.T, links []*testenv.Link) (restore func()) {
	for _, k := range links {
		k.Cut(t)
	}
	restored := false
	return func() {
		if !restored {
			restored = true
			for _, k := range links {
				k.Restore(t)
			}
		}
	}
}

// shiftLoad is one key of drill-shift driven by driveIntoUS: eu's rate throughout, us's
// from the moment the drill cuts (cutWhenSettled) until it ends (end).
type shiftLoad struct {
	began time.Time
	from  atomic.Int64 // us's traffic starts this long after began (ns); none until set
	done  <-chan []stack.Answer
	stop  context.CancelFunc
}

// driveIntoUS drives one key of drill-shift for at most most: euRate a second to eu's
// enforcers throughout and usRate to us's once cutWhenSettled says (rates in whole hundreds
// a second, calls round robin over each region's enforcers).
func driveIntoUS(t *testing.T, eu, us *stack.Region, key string, euRate, usRate float64, most time.Duration) *shiftLoad {
	cycle := int64((euRate + usRate) / 100) // e.g. of every 7 calls, 4 to eu-west, 3 to us-east
	ctx, stop := context.WithCancel(context.Background())
	l := &shiftLoad{began: time.Now(), stop: stop}
	l.from.Store(math.MaxInt64)
	done := make(chan []stack.Answer, 1)
	l.done = done
	go func() {
		done <- stack.Drive(t, ctx, euRate+usRate, most, 48, func(i int64, at time.Duration) *stack.Call {
			r := eu
			if i%cycle >= int64(euRate/100) {
				if at < time.Duration(l.from.Load()) {
					return nil
				}
				r = us
			}
			return &stack.Call{To: r.Enforcers[i%int64(len(r.Enforcers))], Req: req("drill-shift", key, ""), Class: r.Name}
		})
	}()
	t.Cleanup(stop)
	return l
}

// cutWhenSettled waits until identity's newest shares give region at least 0.8 (the key's
// traffic is there, so the drill has something to move) — from least after the load
// began, failing t after most — and starts us's traffic then: the moment the drill cuts.
// It returns that moment, from the load's start, and the shares. A fixed wait failed the
// drill now and then on a slow machine (eu-west at 0.62 after 10 s).
func (l *shiftLoad) cutWhenSettled(t *testing.T, sums *shareSums, identity, region string, least, most time.Duration) (time.Duration, map[string]float64) {
	t.Helper()
	time.Sleep(time.Until(l.began.Add(least)))
	for lastShares(sums, identity)[region] < 0.8 && time.Since(l.began) < most {
		time.Sleep(100 * time.Millisecond)
	}
	last := settledIn(t, sums, identity, region)
	at := time.Since(l.began)
	l.from.Store(int64(at))
	return at, last
}

// end stops the load at d from its start and returns its answers.
func (l *shiftLoad) end(d time.Duration) []stack.Answer {
	time.Sleep(time.Until(l.began.Add(d)))
	l.stop()
	return <-l.done
}

// settledIn is identity's newest published shares; it fails t unless region holds at
// least 0.8 of them (the key's traffic is there, so the drill has something to move).
func settledIn(t *testing.T, sums *shareSums, identity, region string) map[string]float64 {
	t.Helper()
	last := lastShares(sums, identity)
	if last[region] < 0.8 {
		t.Fatalf("%s's share of %s is %.2f: the shares did not settle with its traffic (want ≥ 0.8); the drill would not test anything", region, identity, last[region])
	}
	return last
}

// lastShares is the newest published shares of identity by region (the default split
// when the newest set does not list it).
func lastShares(sums *shareSums, identity string) map[string]float64 {
	sets := sums.Sets()
	if len(sets) == 0 {
		return sharesOf(seenSet{}, identity)
	}
	return sharesOf(sets[len(sets)-1], identity)
}

func metricsNow(e *stack.Enforcer) (stack.Metrics, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return e.Metrics(ctx)
}

// avg is the mean of xs[from:to] (clipped), 0 for none.
func avg(xs []int, from, to int) float64 {
	from, to = max(from, 0), min(to, len(xs))
	if to <= from {
		return 0
	}
	sum := 0
	for _, x := range xs[from:to] {
		sum += x
	}
	return float64(sum) / float64(to-from)
}

func roundAll(m map[string]time.Duration) map[string]time.Duration {
	out := map[string]time.Duration{}
	for k, v := range m {
		out[k] = v.Round(10 * time.Millisecond)
	}
	return out
}
