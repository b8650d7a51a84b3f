package node

import (
	"context"
	"testing"

	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/enforcer/report"
	"github.com/allot-dev/allot/pkg/rules"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// cutOffRig is two enforcers of us-east sharing a store (regionOfTwo), the rule of
// key:k, and a set giving us-east 0.9 of it (not applied yet).
func cutOffRig(t *testing.T) (clk *clock.Fake, a *Node, ta *fakeTransport, b *Node, tb *fakeTransport, rule *rules.Compiled, head contract.Head, entries []contract.Entry) {
	t.Helper()
	clk, a, ta, b, tb, holder := regionOfTwo(t)
	rule = holder.Current().Rule("default")
	head = contract.Head{LeaderRev: 1, Version: 1, PublishedAt: clk.Now(), Entries: 1}
	entries = []contract.Entry{{Rule: "default", Identity: "key:k", Shares: map[string]float64{"us-east": 0.9, "eu-west": 0.1}}}
	return clk, a, ta, b, tb, rule, head, entries
}

// An enforcer whose reports go unaccepted while a region-mate's are accepted fences itself
// (min(share, default)) after CutOffAfter intervals, not after Stale, and marks itself
// with the seq of the last report it sent (the leader may have accepted it, the answer
// lost); it rejoins only once a report sent after its last mark is accepted and it
// applies the newest set the leader had made then, taking its mark back first. A balancer
// that hears nobody fences nobody before Stale.
func TestCutOffAloneFencesItself(t *testing.T) {
	clk, a, ta, b, tb, rule, head, entries := cutOffRig(t)
	ctx := context.Background()
	iv := a.Config().Usage.Interval
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
		fa, fb = ta.rc.Fences(ctx, clk.Now(), seqA+1), tb.rc.Fences(ctx, clk.Now(), seqB+1)
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
	var sentA uint64 // the last report a sent before the round that marked it
	for i := 1; i <= CutOffAfter+3; i++ {
		sentA = seqA
		_, fb := round(false, true)
		if len(fb.Marks) > 0 {
			marked = fb.Marks
			if i > CutOffAfter+2 {
				t.Fatalf("a marked itself after %d intervals, want ≤ %d", i, CutOffAfter+2)
			}
			break
		}
	}
	// Its reports since lastA were sent, not answered: the leader may have taken some (a
	// cut that drops the answer), so the mark names the last it sent.
	if len(marked) != 1 || marked[0].Enforcer != "us-east-1" || marked[0].Seq != sentA || sentA <= lastA {
		t.Fatalf("b's reports list %v, want a's mark naming the last report it sent, %d (its last accepted: %d)", marked, sentA, lastA)
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

// Behind an aggregator (issue 26 §3) an answer confirms an earlier report than the one
// the aggregator takes: the one its last forward the leader accepted listed
// (ReportResponse.heard_seq, dated by heard_ago_ms). An enforcer cut off alone marks
// itself with the seq of the last report it sent — no earlier than the highest its
// aggregator's forwards list (Member.seq), so the leader believes it — and rejoins only
// once the leader confirmed a later one, not when the aggregator takes one.
func TestCutOffAloneBehindAggregator(t *testing.T) {
	clk, a, ta, b, tb, rule, head, entries := cutOffRig(t)
	ctx := context.Background()
	iv := a.Config().Usage.Interval
	a.Shares().Apply(head, entries, clk.Now())
	b.Shares().Apply(head, entries, clk.Now())
	seqA, seqB := uint64(100), uint64(200)
	// confirmedA: the last of a's reports a forward listed that the leader accepted.
	var confirmedA uint64
	// One interval: each tries a report; the aggregator takes it unless cut, and answers
	// with the report its last forward confirmed, an interval earlier; then it forwards.
	round := func(aTaken bool) (fb report.Fenced) {
		t.Helper()
		clk.Advance(iv)
		ta.rc.Fences(ctx, clk.Now(), seqA+1)
		fb = tb.rc.Fences(ctx, clk.Now(), seqB+1)
		seqA++
		seqB++
		at := clk.Now().Add(-iv)
		if aTaken {
			if confirmedA != 0 {
				ta.rc.Accepted(report.Acceptance{At: at, Seq: confirmedA, LeaderRev: 1, Version: 1})
			}
			confirmedA = seqA // the forward lists it, the leader accepts
		}
		tb.rc.Accepted(report.Acceptance{At: at, Seq: seqB - 1, LeaderRev: 1, Version: 1})
		return fb
	}
	for range 3 {
		round(true)
	}
	lastTaken := seqA
	var marked []*allotv1.FenceMark
	var sentA uint64
	for i := 1; i <= CutOffAfter+3 && len(marked) == 0; i++ {
		sentA = seqA
		marked = round(false).Marks
	}
	if len(marked) != 1 || marked[0].Seq != sentA || sentA < lastTaken {
		t.Fatalf("b's reports list %v, want a's mark naming the last seq it sent, %d (its aggregator took up to %d, the leader's last of it)", marked, sentA, lastTaken)
	}
	if s := a.Shares().Share(rule, "key:k", clk.Now()); s != 0.5 {
		t.Fatalf("a's share cut off: %v, want min(0.9, default 0.5)", s)
	}
	// a reaches its aggregator again: the answer confirms only its mark's report, so a
	// stays fenced; at the next, the leader confirmed the later one and a rejoins.
	fb := round(true)
	if fb = round(true); len(fb.Marks) != 1 {
		t.Fatalf("marks %v once a's aggregator took a report after the mark, the leader not yet: want a's", fb.Marks)
	}
	if s := a.Shares().Share(rule, "key:k", clk.Now()); s != 0.5 {
		t.Fatalf("a's share with only the aggregator's word: %v, want 0.5", s)
	}
	round(true)
	if fb = round(true); fb.Seen != 0 {
		t.Fatalf("fenced_seen %d once the leader confirmed a report after the mark, want 0", fb.Seen)
	}
	if s := a.Shares().Share(rule, "key:k", clk.Now()); s != 0.9 {
		t.Fatalf("a's share rejoined: %v, want 0.9", s)
	}
}
