package rules

import (
	"strings"
	"testing"
	"time"
)

// The period's bounds, as a table: time zones, the daylight-saving days of 23 and 25
// hours, ISO weeks across a year's end, month ends and a leap year.
func TestPeriodBounds(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	santiago, err := time.LoadLocation("America/Santiago")
	if err != nil {
		t.Fatal(err)
	}
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	kolkata, err := time.LoadLocation("Asia/Kolkata")
	if err != nil {
		t.Fatal(err)
	}
	utc := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		name       string
		at         string
		p          Period
		loc        *time.Location
		start, end string // in UTC
		hours      float64
	}{
		{"utc day", "2026-12-04T19:54:00Z", PeriodDay, time.UTC, "2026-12-04T00:00:00Z", "2026-12-05T00:00:00Z", 24},
		{"utc midnight starts a day", "2026-12-04T00:00:00Z", PeriodDay, time.UTC, "2026-12-04T00:00:00Z", "2026-12-05T00:00:00Z", 24},
		{"a nanosecond before midnight", "2026-12-04T23:59:59.999999999Z", PeriodDay, time.UTC, "2026-12-04T00:00:00Z", "2026-12-05T00:00:00Z", 24},
		{"nil zone is UTC", "2026-12-04T19:54:00Z", PeriodDay, nil, "2026-12-04T00:00:00Z", "2026-12-05T00:00:00Z", 24},
		{"paris winter day", "2026-12-04T23:30:00Z", PeriodDay, paris, "2026-12-04T23:00:00Z", "2026-12-05T23:00:00Z", 24},
		{"paris day of 23 hours", "2026-03-29T12:00:00Z", PeriodDay, paris, "2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z", 23},
		{"paris day of 25 hours", "2026-10-25T12:00:00Z", PeriodDay, paris, "2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z", 25},
		{"new york day of 23 hours", "2026-03-08T12:00:00Z", PeriodDay, ny, "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z", 23},
		{"santiago: the midnight skipped starts the day at the jump", "2026-09-06T12:00:00Z", PeriodDay, santiago, "2026-09-06T04:00:00Z", "2026-09-07T03:00:00Z", 23},
		{"santiago: the day before ends at the jump", "2026-09-06T03:30:00Z", PeriodDay, santiago, "2026-09-05T04:00:00Z", "2026-09-06T04:00:00Z", 24},
		{"half-hour zone", "2026-12-04T18:29:00Z", PeriodDay, kolkata, "2026-12-03T18:30:00Z", "2026-12-04T18:30:00Z", 24},
		{"half-hour zone at its midnight", "2026-12-04T18:30:00Z", PeriodDay, kolkata, "2026-12-04T18:30:00Z", "2026-12-05T18:30:00Z", 24},
		{"iso week from monday", "2026-12-04T10:00:00Z", PeriodWeek, time.UTC, "2026-11-30T00:00:00Z", "2026-12-07T00:00:00Z", 168},
		{"sunday ends the week", "2026-12-06T23:59:00Z", PeriodWeek, time.UTC, "2026-11-30T00:00:00Z", "2026-12-07T00:00:00Z", 168},
		{"monday starts a week", "2026-12-07T00:00:00Z", PeriodWeek, time.UTC, "2026-12-07T00:00:00Z", "2026-12-14T00:00:00Z", 168},
		{"week across the year's end", "2027-01-01T12:00:00Z", PeriodWeek, time.UTC, "2026-12-28T00:00:00Z", "2027-01-04T00:00:00Z", 168},
		{"paris week of 167 hours", "2026-03-27T12:00:00Z", PeriodWeek, paris, "2026-03-22T23:00:00Z", "2026-03-29T22:00:00Z", 167},
		{"month of 31 days", "2026-12-31T23:59:59Z", PeriodMonth, time.UTC, "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z", 31 * 24},
		{"month of 30 days", "2026-11-15T00:00:00Z", PeriodMonth, time.UTC, "2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z", 30 * 24},
		{"february", "2026-02-28T12:00:00Z", PeriodMonth, time.UTC, "2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z", 28 * 24},
		{"leap february", "2028-02-29T12:00:00Z", PeriodMonth, time.UTC, "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z", 29 * 24},
		{"leap day", "2028-02-29T12:00:00Z", PeriodDay, time.UTC, "2028-02-29T00:00:00Z", "2028-03-01T00:00:00Z", 24},
		{"paris month with the spring change", "2026-03-31T21:59:00Z", PeriodMonth, paris, "2026-02-28T23:00:00Z", "2026-03-31T22:00:00Z", 31*24 - 1},
		{"paris: already april", "2026-03-31T22:00:00Z", PeriodMonth, paris, "2026-03-31T22:00:00Z", "2026-04-30T22:00:00Z", 30 * 24},
		{"new year in paris is still december in utc", "2026-12-31T23:30:00Z", PeriodMonth, paris, "2026-12-31T23:00:00Z", "2027-01-31T23:00:00Z", 31 * 24},
	} {
		at := utc(tc.at)
		start, end := PeriodBounds(at, tc.p, tc.loc)
		if !start.Equal(utc(tc.start)) || !end.Equal(utc(tc.end)) {
			t.Errorf("%s: bounds of %s = [%s, %s), want [%s, %s)", tc.name, tc.at,
				start.UTC().Format(time.RFC3339), end.UTC().Format(time.RFC3339), tc.start, tc.end)
			continue
		}
		if start.After(at) || !end.After(at) {
			t.Errorf("%s: %s not in [%s, %s)", tc.name, tc.at, start, end)
		}
		if h := end.Sub(start).Hours(); h != tc.hours {
			t.Errorf("%s: period of %v hours, want %v", tc.name, h, tc.hours)
		}
		// The next period starts where this one ends.
		if s2, _ := PeriodBounds(end, tc.p, tc.loc); !s2.Equal(end) {
			t.Errorf("%s: the next period starts at %s, not at this one's end %s", tc.name, s2, end)
		}
	}
}

// Periods tile time: walking a year hour by hour in a zone with daylight saving, every
// instant is in exactly one period and the starts never move backwards.
func TestPeriodBoundsTile(t *testing.T) {
	for _, zone := range []string{"UTC", "Europe/Paris", "America/Santiago", "Australia/Lord_Howe"} {
		loc, err := loadZone(zone)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []Period{PeriodDay, PeriodWeek, PeriodMonth} {
			at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			prevStart, prevEnd := PeriodBounds(at, p, loc)
			for range 366 * 24 {
				at = at.Add(time.Hour)
				s, e := PeriodBounds(at, p, loc)
				if s.After(at) || !e.After(at) {
					t.Fatalf("%s %s: %s not in [%s, %s)", zone, p, at, s, e)
				}
				if !s.Equal(prevStart) && !s.Equal(prevEnd) {
					t.Fatalf("%s %s: period [%s, %s) does not follow [%s, %s)", zone, p, s, e, prevStart, prevEnd)
				}
				prevStart, prevEnd = s, e
			}
		}
	}
}

// A calendar quota parses, validates, compiles apart from the buckets with its zone
// loaded, and writes back (YAML and JSON) to the same spec.
func TestCalendarQuota(t *testing.T) {
	src := "rules:\n  - id: daily\n    limits:\n      - {name: second, rate: 5, per: 1s}\n" +
		"      - {name: day, quota: 10000, period: day, time_zone: Europe/Paris}\n" +
		"      - {name: month, quota: 200000, period: month}\n"
	s, err := ParseYAML([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := LimitSpec{Name: "day", Quota: 10000, Period: PeriodDay, TimeZone: "Europe/Paris"}
	if l := s.Rules[0].Limits[1]; l != want || !l.IsQuota() || l.IsInflight() {
		t.Fatalf("parsed as %+v, want %+v", l, want)
	}
	snap, err := Compile(s, CompileOptions{Region: "b", Regions: map[string]float64{"a": 1, "b": 1}})
	if err != nil {
		t.Fatal(err)
	}
	c := snap.Rule("daily")
	if c == nil || len(c.Global) != 1 || len(c.Limits) != 1 || len(c.Calendar) != 2 {
		t.Fatalf("compiled as %+v", c)
	}
	q := c.Calendar[0]
	if q.Name != "daily/day" || q.Quota != 10000 || q.Period != PeriodDay || q.Zone != "Europe/Paris" || q.Loc.String() != "Europe/Paris" {
		t.Fatalf("quota compiled as %+v (not split by the region's share)", q)
	}
	if m := c.Calendar[1]; m.Zone != "UTC" || m.Loc != time.UTC || m.Period != PeriodMonth {
		t.Fatalf("month quota compiled as %+v, want UTC by default", m)
	}
	back, err := ParseYAML(EncodeSet(s))
	if err != nil || len(back.Rules[0].Limits) != 3 {
		t.Fatalf("EncodeSet round trip: %v, %+v", err, back)
	}
	for i, l := range s.Rules[0].Limits {
		if back.Rules[0].Limits[i] != l {
			t.Errorf("EncodeSet round trip: limits[%d] = %+v, want %+v", i, back.Rules[0].Limits[i], l)
		}
	}
	j, err := EncodeRule(&s.Rules[0])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(j), `"time_zone": "Europe/Paris"`) || !strings.Contains(string(j), `"period": "day"`) {
		t.Fatalf("EncodeRule wrote %s", j)
	}
	back, err = ParseYAML([]byte("rules:\n  - " + strings.ReplaceAll(string(j), "\n", "\n    ") + "\n"))
	if err != nil || back.Rules[0].Limits[1] != want {
		t.Fatalf("EncodeRule round trip: %v, %+v", err, back)
	}
	// A rule of only a quota compiles with no buckets.
	s, err = ParseYAML([]byte("rules:\n  - id: only\n    limits: [{name: week, quota: 7, period: week}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if snap, err = Compile(s, CompileOptions{}); err != nil {
		t.Fatal(err)
	}
	if c := snap.Rule("only"); len(c.Global) != 0 || len(c.Calendar) != 1 || c.Calendar[0].Period != PeriodWeek {
		t.Fatalf("compiled as %+v", c)
	}
}
