package rules

import (
	"fmt"
	"strings"
	"time"
	_ "time/tzdata" // the IANA database inside the binary: images without /usr/share/zoneinfo still load any zone
)

// Calendar quotas (LimitSpec.Quota): "10,000 a day per key", counted from a calendar
// boundary in a named time zone, not continuously like a bucket.
//
// A period is a day (midnight to midnight), an ISO week (Monday 00:00 to the next
// Monday 00:00) or a month (the 1st 00:00 to the next 1st 00:00), in the limit's time
// zone (UTC by default). The boundaries are wall-clock midnights computed with
// time.Date in that zone, so a day across a daylight-saving change lasts 23 or 25
// hours, and a month 28 to 31 days. The IANA database is compiled in (time/tzdata): a
// zone loads the same on a machine or image without /usr/share/zoneinfo.

// Period is the length of a calendar quota.
type Period uint8

// The periods of a calendar quota.
const (
	PeriodDay Period = iota + 1
	PeriodWeek
	PeriodMonth
)

// periodNames are the periods as written in a rule.
var periodNames = [...]string{PeriodDay: "day", PeriodWeek: "week", PeriodMonth: "month"}

// String is the period as written in a rule ("day", "week", "month"); "" for none.
func (p Period) String() string {
	if int(p) < len(periodNames) {
		return periodNames[p]
	}
	return ""
}

// ParsePeriod reads a period as written ("day", "week", "month").
func ParsePeriod(s string) (Period, bool) {
	for p, n := range periodNames {
		if n != "" && n == s {
			return Period(p), true
		}
	}
	return 0, false
}

// Nominal is the period's length as the RateLimit fields and Envoy's units state it: a
// day 86400 s, a week 7 days, a month 30 days (envoyproxy/ratelimit's MONTH). The real
// period may be an hour (daylight saving) or a few days (months) longer or shorter;
// the reset the answers carry is the real boundary.
func (p Period) Nominal() time.Duration {
	switch p {
	case PeriodDay:
		return 24 * time.Hour
	case PeriodWeek:
		return 7 * 24 * time.Hour
	case PeriodMonth:
		return 30 * 24 * time.Hour
	}
	return 0
}

// PeriodBounds returns the start and the end of the period p that holds t in the zone
// loc: start <= t < end. Pure: the same t, p and loc give the same bounds on any
// machine. A midnight that a daylight-saving jump skips (America/Santiago's, for one) is
// the instant of the jump, the first instant of the new day, so the bounds still tile
// time with no gap or overlap.
func PeriodBounds(t time.Time, p Period, loc *time.Location) (start, end time.Time) {
	if loc == nil {
		loc = time.UTC
	}
	lt := t.In(loc)
	y, m, d := lt.Date()
	switch p {
	case PeriodWeek:
		back := (int(lt.Weekday()) + 6) % 7 // days since Monday (ISO 8601)
		start, end = midnight(y, m, d-back, loc), midnight(y, m, d-back+7, loc)
	case PeriodMonth:
		start, end = midnight(y, m, 1, loc), midnight(y, m+1, 1, loc)
	default:
		start, end = midnight(y, m, d, loc), midnight(y, m, d+1, loc)
	}
	return start, end
}

// midnight is the first instant of day d of month m of year y in loc (time.Date
// normalizes d and m). Where a daylight-saving jump skips midnight, time.Date gives a
// time an hour off the jump, on either side: the first instant of the day is then the
// jump itself, the bound of the zone offset time.Date chose.
func midnight(y int, m time.Month, d int, loc *time.Location) time.Time {
	t := time.Date(y, m, d, 0, 0, 0, 0, loc)
	switch t.Hour() {
	case 0:
		return t
	case 23: // before the jump, still the day before: the jump is where its offset ends
		_, end := t.ZoneBounds()
		if !end.IsZero() {
			return end
		}
	default: // after the jump: the jump is where its offset starts
		start, _ := t.ZoneBounds()
		if !start.IsZero() {
			return start
		}
	}
	return t
}

// loadZone loads a rule's time zone: "" is UTC; "Local" is refused (it would depend on
// the machine); anything else is an IANA name ("Europe/Paris").
func loadZone(name string) (*time.Location, error) {
	switch name {
	case "", "UTC":
		return time.UTC, nil
	case "Local":
		return nil, fmt.Errorf("%q depends on the machine; name a zone (UTC, Europe/Paris, America/New_York)", name)
	}
	if len(name) > 64 || strings.ContainsAny(name, " \\") || strings.HasPrefix(name, "/") || strings.Contains(name, "..") {
		return nil, fmt.Errorf("%.70q is not an IANA time zone name (like UTC, Europe/Paris)", name)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("%q is not an IANA time zone name (like UTC, Europe/Paris)", name)
	}
	return loc, nil
}

// CalendarQuota is a compiled calendar quota (LimitSpec.Quota): at most Quota tokens of
// one identity from the start of each period to its end, over every region together.
// Regions' shares do not split it: each enforcer compares the count of every enforcer
// with the whole quota (pkg/quota), and other regions' counts enter through
// quota.View. Immutable once compiled.
type CalendarQuota struct {
	Name   string // "<rule id>/<limit name>": the counter's name, apart from the buckets'
	Quota  int64  // tokens an identity may use in one period, all regions together
	Period Period
	Zone   string         // the time zone as written ("UTC" when none was)
	Loc    *time.Location // Zone, loaded
}

// ID is q's name (quota.Limit).
func (q *CalendarQuota) ID() string { return q.Name }

// Max is q's quota (quota.Limit).
func (q *CalendarQuota) Max() int64 { return q.Quota }

// Bounds returns the start and end of the period that holds t (PeriodBounds).
func (q *CalendarQuota) Bounds(t time.Time) (start, end time.Time) {
	return PeriodBounds(t, q.Period, q.Loc)
}
