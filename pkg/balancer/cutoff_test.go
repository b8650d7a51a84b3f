package balancer

import (
	"testing"
	"time"
)

// TestCutOffAloneReleasedByItsMark: as TestOneEnforcerCutOffNeverOver, but eu-west-0 fences
// itself as cut off alone (pkg/enforcer/node: its region-mate is heard, it is not) 40 s
// after its last accepted report and marks itself in its region's store naming the last
// report it sent; eu-west-1's reports list the mark (fence_marks). The leader stops
// waiting for it once eu-west-1's reports have shown the mark for AckTimeout, not Stale +
// AckTimeout after its last report, and the applied shares never sum over 1 (world.check,
// every second). A mark naming a later seq than the last the leader accepted (reports
// sent since, lost or unanswered: a cut that drops an answer) releases it the same way; a
// mark naming an older seq (one from before a report of it the leader accepted since)
// releases nothing.
//
// Across a leader change (the new leader restored eu-west-0 from the members and never
// heard it) a mark naming any seq releases it the same way: a report of it accepted after
// its mark would have been accepted by the new leader, which would have heard it.
//
// Behind aggregators (issue 26 §3) the same: a forward lists the marks of the member
// report received last, dated by fence_marks_ago_ms, and each member's highest seq, which
// the cut-off enforcer's mark names (the last seq its aggregator took); later forwards
// still list it, silent, and neither hold it again nor restart its mark's count.
func TestCutOffAloneReleasedByItsMark(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		older, later, leader, agg bool
	}{{"its last report", false, false, false, false}, {"an older report", true, false, false, false},
		{"a later report", false, true, false, false}, {"a new leader", false, false, true, false},
		{"behind aggregators", false, false, false, true}, {"behind aggregators, an older report", true, false, false, true},
		{"behind aggregators, a later report", false, true, false, true}, {"behind aggregators, a new leader", false, false, true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			c, w, k, moved := euWestKey(t)
			if tc.agg {
				w.viaAggregators()
				w.step(30 * time.Second)
			}
			for _, e := range w.enfs {
				if e.id == "eu-west-0" {
					e.cut, e.cutAt, e.alone, e.fenceAt = true, w.now, true, e.heard.Add(40*time.Second)
					switch {
					case tc.older:
						e.markSeq = e.seq - 1
					case tc.later:
						e.markSeq = e.seq + 2 // two more sent, neither answered
					}
				}
			}
			if tc.leader {
				w.step(10 * time.Second)
				w.newLeader(w.last)
				c = w.c
			}
			*moved = true
			start, took := w.now, time.Duration(0)
			for took == 0 && w.now.Sub(start) < c.cfg.Stale+time.Minute {
				w.step(time.Second)
				if w.published(k)[0] >= 0.6 {
					took = w.now.Sub(start)
				}
			}
			// A minute on: applied everywhere, eu-west-0 still serving cut off, and once
			// released never waited for again (an aggregator's forwards still list it).
			released := false
			for range 60 {
				w.step(time.Second)
				rs := &w.c.regions[w.c.regionIdx["eu-west"]]
				if released && rs.enforcers["eu-west-0"] != nil {
					t.Fatalf("%v: eu-west-0, released on its mark, is waited for again", w.now)
				}
				released = released || rs.released["eu-west-0"] != nil
			}
			t.Logf("us-east at ≥ 0.6 of the limit %v after the move; max applied sum %.4f", took, w.maxAppl)
			switch {
			case took == 0:
				t.Fatalf("us-east never got 0.6: shares %v", w.published(k))
			case !tc.older && took > 90*time.Second:
				t.Fatalf("released %v after the move, want within 90 s (the mark, then AckTimeout)", took)
			case tc.older && took < c.cfg.Stale-c.cfg.Interval:
				t.Fatalf("released %v after the move by a mark naming an older report, want Stale + AckTimeout after its last report", took)
			}
			if !tc.older && !released {
				t.Fatalf("eu-west-0 never released on its mark")
			}
		})
	}
}
