package report

import (
	"testing"
	"time"
)

// TestSchedule walks one schedule through the cases of the Reporter's loop: regular
// reports on a cadence that early and acknowledging reports do not move, early reports
// held back until EarlyGap, acknowledgements until AckGap, and a regular report that
// carries neither flag when it coincides with an early or acknowledging one.
func TestSchedule(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	cfg := DefaultConfig() // Interval 10s, EarlyGap 1s
	s := NewSchedule(cfg, 250*time.Millisecond, t0)
	start := t0 // the table's interval start: the last report's time
	const sec = time.Second
	steps := []struct {
		name    string
		now     time.Duration
		jumped  bool
		changed bool // a new share set was applied just before now
		want    Step
	}{
		{name: "nothing due", now: 1 * sec, want: Step{Wake: at(10 * sec)}},
		{name: "jump before EarlyGap: wake at it", now: 500 * time.Millisecond, jumped: true, want: Step{Wake: at(1 * sec)}},
		{name: "jump, EarlyGap passed", now: 1 * sec, jumped: true, want: Step{Report: true, Early: true}},
		{name: "after the early report: the cadence holds", now: 1 * sec, want: Step{Wake: at(10 * sec)}},
		{name: "new set within AckGap: wake at it", now: 1100 * time.Millisecond, changed: true, want: Step{Wake: at(1250 * time.Millisecond)}},
		{name: "AckGap passed", now: 1250 * time.Millisecond, want: Step{Report: true, Ack: true}},
		{name: "regular", now: 10 * sec, want: Step{Report: true}},
		{name: "new set long after the last report: at once", now: 12 * sec, changed: true, want: Step{Report: true, Ack: true}},
		{name: "regular with a jump and a new set: one regular report", now: 20 * sec, jumped: true, changed: true, want: Step{Report: true}},
		{name: "late: one report, the cadence skips what passed", now: 41 * sec, want: Step{Report: true}},
		{name: "next regular", now: 41 * sec, want: Step{Wake: at(50 * sec)}},
	}
	for _, st := range steps {
		if st.changed {
			s.SharesChanged()
		}
		now := at(st.now)
		got := s.At(now, start, st.jumped)
		if got != st.want {
			t.Fatalf("%s: At(%v) = %+v, want %+v", st.name, st.now, got, st.want)
		}
		if got.Report {
			s.Reported(now)
			start = now
		}
	}
}

// A small key's move, just after the enforcer acknowledged a share set: a 100/s key whose
// 48/s moved to a region of three enforcers holding a quarter of it is refused about 8
// tokens a second at each once that share's burst is spent. Its early report goes out a
// second after the acknowledgement (EarlyGap 1 s, a jump of earlyJump 6 tokens): with 2 s
// and 10 it went out 2 s after, and the move's detection, most of a move's time, took 2 s
// or more (many-keys over 40 seeds: 139 moves over 3 s; 69 with these).
func TestSmallMoveReportedASecondAfterAnAck(t *testing.T) {
	tb := newTable(t, nil)
	s := NewSchedule(tb.Config(), 250*time.Millisecond, t0)
	a := rule("a", 100)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	ackAt := at(5 * time.Second)
	s.SharesChanged()
	if step := s.At(ackAt, tb.Start(), tb.Jumped()); !step.Report || !step.Ack {
		t.Fatalf("acknowledgement at 5 s: %+v", step)
	}
	tb.Report(ackAt)
	s.Reported(ackAt)
	for d := 200 * time.Millisecond; d <= 3*time.Second; d += 125 * time.Millisecond { // 8 a second
		now := ackAt.Add(d)
		tb.ObserveTake(a, "key:moved", 1, false, false, 0, now)
		if step := s.At(now, tb.Start(), tb.Jumped()); step.Report {
			if !step.Early || d > 1100*time.Millisecond {
				t.Fatalf("reported %+v %v after the acknowledgement, want early within 1.1 s", step, d)
			}
			return
		}
	}
	t.Fatal("no early report within 3 s of the move")
}
