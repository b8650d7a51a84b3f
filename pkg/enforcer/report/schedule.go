package report

import "time"

// Schedule says when an enforcer reports: every Interval on a fixed cadence, and in
// between early when the table's refusals jumped (once EarlyGap has passed since the last
// report) or to acknowledge a new share set (once AckGap has passed). It is the
// Reporter's loop with the waiting taken out — "report now, or when next?" answered from
// the time and the table's state, both passed in — so the Reporter's goroutine and
// regionsim's virtual enforcers follow the same schedule: the goroutine sleeps on a
// clock until Step.Wake or a signal, the simulator schedules an event.
//
// The cadence does not move for the reports in between: every enforcer's regular reports
// stay spread over the interval as they started, so the balancer's interval recompute
// reads about a whole interval of every enforcer's traffic, not the second or so since
// the acknowledgements that a share change makes every enforcer send at once (which
// would realign them all, and leave the next recompute a window of a few
// enforcer-seconds).
//
// A Schedule is a value owned by one loop; not safe for concurrent use. The zero
// Schedule is not usable: build it with NewSchedule.
type Schedule struct {
	interval, earlyGap, ackGap time.Duration
	due                        time.Time // the next regular report
	ack                        bool      // a new share set was applied and not reported yet
}

// NewSchedule starts the schedule of the reports of a table with cfg (its Interval and
// EarlyGap) whose first interval began at start: the first regular report is due at
// start + Interval. ackGap is ReporterConfig.AckGap.
func NewSchedule(cfg Config, ackGap time.Duration, start time.Time) Schedule {
	return Schedule{interval: cfg.Interval, earlyGap: cfg.EarlyGap, ackGap: ackGap, due: start.Add(cfg.Interval)}
}

// Step is a Schedule's answer at one instant.
type Step struct {
	// Report: report now, flagged Early (refusals jumped) or Ack (acknowledging a new
	// share set) when it comes before the regular one; a regular report carries neither
	// flag. Call Reported once it is drained.
	Report, Early, Ack bool
	// Wake, when there is no report now, is the soonest one can be due if nothing is
	// signalled meanwhile: the next regular report, or EarlyGap (AckGap) after the last
	// report when refusals jumped (a share set is waiting). A signal — a jump
	// (Table.Early), a new share set (SharesChanged) — may bring it sooner: ask At again.
	Wake time.Time
}

// At is the schedule at now for a table whose current interval began at start (Table.Start)
// and whose refusals jumped this interval, or not (Table.Jumped). It reads nothing else
// and changes nothing.
func (s Schedule) At(now, start time.Time, jumped bool) Step {
	regular := !now.Before(s.due)
	early := jumped && now.Sub(start) >= s.earlyGap
	ack := s.ack && !now.Before(start.Add(s.ackGap))
	if regular || early || ack {
		return Step{Report: true, Early: early && !regular, Ack: ack && !regular}
	}
	wake := s.due
	if jumped { // jumped, but EarlyGap has not passed: wake when it has
		wake = earliest(wake, start.Add(s.earlyGap))
	}
	if s.ack { // AckGap has not passed since the last report: wake when it has
		wake = earliest(wake, start.Add(s.ackGap))
	}
	return Step{Wake: wake}
}

// SharesChanged records that a new share set was applied (overrides.Holder.Changed): the
// next report, AckGap after the last one at the soonest, acknowledges it.
func (s *Schedule) SharesChanged() { s.ack = true }

// Reported records a report drained at now, which At asked for: it carried any pending
// acknowledgement, and a regular one moves the cadence on by whole Intervals past now.
func (s *Schedule) Reported(now time.Time) {
	s.ack = false
	for !s.due.After(now) {
		s.due = s.due.Add(s.interval)
	}
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
