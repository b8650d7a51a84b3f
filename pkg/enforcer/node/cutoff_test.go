package node

import (
	"context"
	"testing"

	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/enforcer/report"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// An enforcer whose reports go unaccepted while a region-mate's are accepted fences itself
// (min(share, default)) after CutOffAfter intervals, not after Stale, and marks itself
// with the seq of its last accepted report; it rejoins only once a report sent after its
// last mark is accepted and it applies the newest set the leader had made then, taking
// its mark back first. A balancer
// that hears nobody fences nobody before Stale.
func TestCutOffAloneFencesItself(t *testing.T) {
	clk, a, ta, b, tb, holder := regionOfTwo(t)
	ctx := context.Background()
	rule := holder.Current().Rule("default")
	iv := a.Config().Usage.Interval
	head := contract.Head{LeaderRev: 1, Version: 1, PublishedAt: clk.Now(), Entries: 1}
	entries := []contract.Entry{{Rule: "default", Identity: "key:k", Shares: map[string]float64{"us-east": 0.9, "eu-west": 0.1}}}
	apply := func() {
		head.PublishedAt = clk.Now()
		a.Shares().Apply(head, entries, clk.Now())
		b.Shares().Apply(head, entries, clk.Now())
	}
	seqA, seqB := uint64(100), uint64(200)
	leaderVer := head.Version
	// One interval: each tries a report (its Fences hook first); accepted unless cut.
	round := func(aHeard, bHeard bool) (fa, fb report.Fenced) {
		t.Helper()
		clk.Advance(iv)
		fa, fb = ta.rc.Fences(ctx, clk.Now()), tb.rc.Fences(ctx, clk.Now())
		seqA++
		seqB++
		// The leader says the newest set it has made (leaderVer).
		if aHeard {
			ta.rc.Accepted(report.Acceptance{At: clk.Now(), Seq: seqA, LeaderRev: head.LeaderRev, Version: leaderVer})
		}
		if bHeard {
			tb.rc.Accepted(report.Acceptance{At: clk.Now(), Seq: seqB, LeaderRev: head.LeaderRev, Version: leaderVer})
		}
		return fa, fb
	}
	apply()
	round(true, true)
	round(true, true)
	if s := a.Shares().Share(rule, "key:k", clk.Now()); s != 0.9 {
		t.Fatalf("a's share heard: %v, want 0.9", s)
	}

	// The whole region unheard (the balancer down): nobody fences itself before Stale.
	for range 6 {
		if fa, _ := round(false, false); fa.Seen != 0 {
			t.Fatalf("fenced_seen %d with the balancer down for the whole region, want 0", fa.Seen)
		}
	}
	if s := a.Shares().Share(rule, "key:k", clk.Now()); s != 0.9 {
		t.Fatalf("a's share with nobody heard for 60 s: %v, want 0.9", s)
	}
	round(true, true)
	round(true, true)
	lastA := seqA

	// a cut off alone: b is heard, a is not. Fenced within CutOffAfter + 2 intervals (b
	// records when it was heard at its next report, after a's in each round here).
	var marked []*allotv1.FenceMark
	for i := 1; i <= CutOffAfter+3; i++ {
		_, fb := round(false, true)
		if len(fb.Marks) > 0 {
			marked = fb.Marks
			if i > CutOffAfter+2 {
				t.Fatalf("a marked itself after %d intervals, want ≤ %d", i, CutOffAfter+2)
			}
			break
		}
	}
	if len(marked) != 1 || marked[0].Enforcer != "us-east-1" || marked[0].Seq != lastA {
		t.Fatalf("b's reports list %v, want a's mark naming its last accepted seq %d", marked, lastA)
	}
	if s := a.Shares().Share(rule, "key:k", clk.Now()); s != 0.5 {
		t.Fatalf("a's share cut off: %v, want min(0.9, default 0.5)", s)
	}
	if s := b.Shares().Share(rule, "key:k", clk.Now()); s != 0.9 {
		t.Fatalf("b's share: %v, want 0.9", s)
	}
	if !b.Shares().Cut().IsZero() {
		t.Fatal("b, heard all along, cut itself off")
	}

	// The leader made version 2 meanwhile (it counted a fenced and raised another region).
	// a's reports get through again, its set still version 1: still fenced, and its mark
	// now names the seq accepted since.
	leaderVer = 2
	round(true, true)
	_, fb := round(false, true)
	if s := a.Shares().Share(rule, "key:k", clk.Now()); s != 0.5 || len(fb.Marks) != 1 || fb.Marks[0].Seq != seqA-1 {
		t.Fatalf("heard, applying version 1 where the leader made 2: share %v, marks %v; want 0.5 and a's mark naming seq %d", s, fb.Marks, seqA-1)
	}
	// Version 1 read again (a refresh, not the newest): still fenced.
	apply()
	round(true, true)
	round(true, true)
	if s := a.Shares().Share(rule, "key:k", clk.Now()); s != 0.5 {
		t.Fatalf("heard, version 1 refreshed where the leader made 2: share %v, want 0.5", s)
	}
	// Version 2 read: the next call takes the mark back, then rejoins.
	head.Version = 2
	apply()
	_, fb = round(true, true)
	if s := a.Shares().Share(rule, "key:k", clk.Now()); s != 0.9 || fb.Seen != 0 {
		t.Fatalf("rejoined: share %v, fenced_seen %d; want 0.9 and 0", s, fb.Seen)
	}
}
