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
	cfg := DefaultConfig() // Interval 10s, EarlyGap 2s
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
		{name: "jump before EarlyGap: wake at it", now: 1500 * time.Millisecond, jumped: true, want: Step{Wake: at(2 * sec)}},
		{name: "jump, EarlyGap passed", now: 2 * sec, jumped: true, want: Step{Report: true, Early: true}},
		{name: "after the early report: the cadence holds", now: 2 * sec, want: Step{Wake: at(10 * sec)}},
		{name: "new set within AckGap: wake at it", now: 2100 * time.Millisecond, changed: true, want: Step{Wake: at(2250 * time.Millisecond)}},
		{name: "AckGap passed", now: 2250 * time.Millisecond, want: Step{Report: true, Ack: true}},
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
