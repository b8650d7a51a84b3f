package balancer

import (
	"testing"
	"time"
)

// TestCutOffAloneReleasedByItsMark: as TestOneEnforcerCutOffNeverOver, but eu-west-0 fences
// itself as cut off alone (pkg/enforcer/node: its region-mate is heard, it is not) 40 s
// after its last accepted report and marks itself in its region's store naming that
// report's seq; eu-west-1's reports list the mark (fence_marks). The leader stops waiting
// for it once eu-west-1's reports have shown the mark for AckTimeout, not Stale +
// AckTimeout after its last report, and the applied shares never sum over 1 (world.check, every second). A mark naming an
// older seq (one from before a report of it the leader accepted since) releases nothing.
//
// Across a leader change (the new leader restored eu-west-0 from the members and never
// heard it) a mark naming any seq releases it the same way: a report of it accepted after
// its mark would have been accepted by the new leader, which would have heard it.
func TestCutOffAloneReleasedByItsMark(t *testing.T) {
	for _, tc := range []struct {
		name          string
		older, leader bool
	}{{"its last report", false, false}, {"an older report", true, false}, {"a new leader", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			c, w, k, moved := euWestKey(t)
			for _, e := range w.enfs {
				if e.id == "eu-west-0" {
					e.cut, e.cutAt, e.alone, e.fenceAt = true, w.now, true, e.heard.Add(40*time.Second)
					if tc.older {
						e.markSeq = e.seq - 1
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
			w.step(time.Minute) // applied everywhere, eu-west-0 still serving cut off
			t.Logf("us-east at ≥ 0.6 of the limit %v after the move; max applied sum %.4f", took, w.maxAppl)
			switch {
			case took == 0:
				t.Fatalf("us-east never got 0.6: shares %v", w.published(k))
			case !tc.older && took > 90*time.Second:
				t.Fatalf("released %v after the move, want within 90 s (the mark, then AckTimeout)", took)
			case tc.older && took < c.cfg.Stale-c.cfg.Interval:
				t.Fatalf("released %v after the move by a mark naming an older report, want Stale + AckTimeout after its last report", took)
			}
		})
	}
}
