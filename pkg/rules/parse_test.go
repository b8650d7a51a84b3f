package rules

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseExampleFile(t *testing.T) {
	if err := CheckFile("../../configs/rules/example.yaml"); err != nil {
		t.Fatalf("example rules: %v", err)
	}
	s, err := LoadFile("../../configs/rules/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if s.Version != "example-1" || len(s.Rules) != 10 || !s.Rules[8].Settle {
		t.Fatalf("version %q, %d rules", s.Version, len(s.Rules))
	}
	r := s.Rules[3]
	if r.ID != "acme-launch" || r.Match.APIKey != "k_acme_live_1" || !r.ExpiresAt.Equal(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("override parsed as %+v", r)
	}
	if l := s.Rules[0].Limits[1]; l.Name != "minute" || l.Rate != 1000 || l.Per != time.Minute || l.Burst != 0 {
		t.Fatalf("limit parsed as %+v", l)
	}
	if s.Rules[4].By != ByIP || s.Rules[4].FailMode != FailClosed || s.Rules[5].Mode != ModeShadow || s.Rules[5].By != ByGlobal {
		t.Fatalf("words parsed wrong: %+v %+v", s.Rules[4], s.Rules[5])
	}
	if s.Rules[2].Cost["GET /v1/search"] != 2 || s.Rules[1].Shares["eu-west"] != 0.3 {
		t.Fatal("cost or shares parsed wrong")
	}
}

func TestParseJSON(t *testing.T) {
	s, err := ParseYAML([]byte(`{"rules":[{"id":"a","limits":[{"name":"s","rate":5,"per":"1s"}],"match":{"ip":"10.0.0.0/8"},"by":"ip"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if s.Rules[0].Match.IP != "10.0.0.0/8" || s.Rules[0].By != ByIP {
		t.Fatalf("%+v", s.Rules[0])
	}
	r, err := ParseRule([]byte(`{"id":"k1","match":{"api_key":"abc"},"expires_at":"2030-01-01T00:00:00Z","limits":[{"name":"s","rate":5,"per":"1s"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.ID != "k1" || r.Match.APIKey != "abc" {
		t.Fatalf("%+v", r)
	}
	if _, err := ParseRule([]byte(`{"id":"k1","bogus":1}`)); err == nil || !strings.Contains(err.Error(), `rule "k1": bogus: unknown field "bogus"`) {
		t.Fatalf("strict JSON rule: %v", err)
	}
}

// Each bad input must be rejected with a message naming the rule, the field and the line.
func TestParseAndValidateErrors(t *testing.T) {
	const head = "rules:\n  - id: ok\n    limits: [{name: s, rate: 1, per: 1s}]\n" // lines 1-3
	tests := []struct {
		name string
		in   string
		want []string // substrings of the error
	}{
		{"unknown field", head + "  - id: r1\n    limits: [{name: s, rate: 1, per: 1s}]\n    colour: red\n",
			[]string{`line 6`, `rule "r1"`, `colour`, `unknown field "colour"`}},
		{"unknown match field", head + "  - id: r1\n    match:\n      plann: pro\n    limits: [{name: s, rate: 1, per: 1s}]\n",
			[]string{`line 6`, `rule "r1"`, `match.plann`, `unknown field`}},
		{"unknown top field", "rulez: []\n", []string{`line 1`, `unknown field "rulez"`}},
		{"penalty refusals", head + "  - id: r1\n    limits: [{name: s, rate: 1, per: 1s}]\n    penalty: {refusals: 0, within: 1m, block: 10m}\n",
			[]string{`line 6`, `rule "r1"`, `penalty.refusals: 0, must be in [1, 1000000000]`}},
		{"penalty fractional refusals", head + "  - id: r1\n    limits: [{name: s, rate: 1, per: 1s}]\n    penalty: {refusals: 1.5, within: 1m, block: 10m}\n",
			[]string{`rule "r1"`, `penalty.refusals: 1.5, want a whole number`}},
		{"penalty within", head + "  - id: r1\n    limits: [{name: s, rate: 1, per: 1s}]\n    penalty: {refusals: 10, within: 10ms, block: 10m}\n",
			[]string{`rule "r1"`, `penalty.within: 10ms, must be in [1s, 168h0m0s]`}},
		{"penalty block missing", head + "  - id: r1\n    limits: [{name: s, rate: 1, per: 1s}]\n    penalty: {refusals: 10, within: 1m}\n",
			[]string{`rule "r1"`, `penalty.block: missing`}},
		{"penalty bad duration", head + "  - id: r1\n    limits: [{name: s, rate: 1, per: 1s}]\n    penalty: {refusals: 10, within: 1m, block: forever}\n",
			[]string{`rule "r1"`, `penalty.block: "forever" is not a duration`}},
		{"penalty unknown field", head + "  - id: r1\n    limits: [{name: s, rate: 1, per: 1s}]\n    penalty: {refusals: 10, within: 1m, block: 1m, after: 2}\n",
			[]string{`rule "r1"`, `unknown field "after"`}},
		{"penalty on unlimited", head + "  - id: r1\n    unlimited: true\n    penalty: {refusals: 10, within: 1m, block: 1m}\n",
			[]string{`rule "r1"`, `penalty: beside unlimited`}},
		{"wrong type", head + "  - id: r1\n    limits:\n      - name: s\n        rate: lots\n        per: 1s\n",
			[]string{`line 7`, `rule "r1"`, `limits[0].rate`, "lots"}},
		{"bad duration", head + "  - id: r1\n    limits:\n      - {name: s, rate: 1, per: 1 sec}\n",
			[]string{`line 6`, `rule "r1"`, `limits[0].per`, `"1 sec" is not a duration`}},
		{"missing per", head + "  - id: r1\n    limits:\n      - name: s\n        rate: 1\n",
			[]string{`line 6`, `rule "r1"`, `limits[0].per`, `missing`}},
		{"bad mode", head + "  - id: r1\n    mode: loud\n    limits: [{name: s, rate: 1, per: 1s}]\n",
			[]string{`line 5`, `rule "r1"`, `mode: "loud"`}},
		{"bad fail_mode", head + "  - id: r1\n    fail_mode: ajar\n    limits: [{name: s, rate: 1, per: 1s}]\n",
			[]string{`line 5`, `rule "r1"`, `fail_mode: "ajar"`}},
		{"bad by", head + "  - id: r1\n    by: user\n    limits: [{name: s, rate: 1, per: 1s}]\n",
			[]string{`line 5`, `rule "r1"`, `by: "user"`}},
		{"bad ip", head + "  - id: r1\n    match: {ip: 10.0.0.300}\n    limits: [{name: s, rate: 1, per: 1s}]\n",
			[]string{`line 5`, `rule "r1"`, `match.ip`, `10.0.0.300`}},
		{"bad prefix", head + "  - id: r1\n    match:\n      ip: 10.0.0.0/33\n    limits: [{name: s, rate: 1, per: 1s}]\n",
			[]string{`line 6`, `rule "r1"`, `match.ip`}},
		{"bad time", head + "  - id: r1\n    match: {api_key: k}\n    expires_at: tomorrow\n    limits: [{name: s, rate: 1, per: 1s}]\n",
			[]string{`line 6`, `rule "r1"`, `expires_at`, `RFC 3339`}},
		{"override without expiry", head + "  - id: r1\n    match: {api_key: k}\n    limits: [{name: s, rate: 1, per: 1s}]\n",
			[]string{`line 4`, `rule "r1"`, `expires_at: missing`}},
		{"fractional cost", head + "  - id: r1\n    cost: {GET /x: 1.5}\n    limits: [{name: s, rate: 1, per: 1s}]\n",
			[]string{`line 5`, `rule "r1"`, `cost`, `1.5`}},
		{"cost above burst", head + "  - id: r1\n    cost: {GET /x: 5}\n    limits: [{name: s, rate: 1, per: 1s, burst: 4}]\n",
			[]string{`line 5`, `rule "r1"`, `cost`, `smallest burst 4`}},
		{"duplicate id", head + "  - id: ok\n    limits: [{name: s, rate: 1, per: 1s}]\n",
			[]string{`line 4`, `rule "ok"`, `id`, `unique`}},
		{"missing id", head + "  - limits: [{name: s, rate: 1, per: 1s}]\n",
			[]string{`line 4`, `rule #2`, `id: missing`}},
		{"no limits", head + "  - id: r1\n", []string{`line 4`, `rule "r1"`, `limits: missing`}},
		{"inflight without timeout", head + "  - id: r1\n    limits:\n      - {name: c, concurrent: 5}\n",
			[]string{`line 6`, `rule "r1"`, `limits[0].timeout`, `missing`}},
		{"inflight bad timeout", head + "  - id: r1\n    limits:\n      - {name: c, concurrent: 5, timeout: soon}\n",
			[]string{`line 6`, `rule "r1"`, `limits[0].timeout`, `"soon" is not a duration`}},
		{"inflight short timeout", head + "  - id: r1\n    limits:\n      - {name: c, concurrent: 5, timeout: 10ms}\n",
			[]string{`line 6`, `rule "r1"`, `limits[0].timeout`, `10ms, must be in [1s, 1h0m0s]`}},
		{"inflight fractional", head + "  - id: r1\n    limits:\n      - {name: c, concurrent: 2.5, timeout: 30s}\n",
			[]string{`line 6`, `rule "r1"`, `limits[0].concurrent`, `2.5`}},
		{"inflight zero", head + "  - id: r1\n    limits:\n      - {name: c, concurrent: 0, timeout: 30s}\n",
			[]string{`line 6`, `rule "r1"`, `limits[0].concurrent`, `0, must be in [1, 100000]`}},
		{"inflight huge", head + "  - id: r1\n    limits:\n      - {name: c, concurrent: 1e6, timeout: 30s}\n",
			[]string{`line 6`, `rule "r1"`, `limits[0].concurrent`, `1000000, must be in [1, 100000]`}},
		{"inflight with rate", head + "  - id: r1\n    limits:\n      - {name: c, concurrent: 5, timeout: 30s, rate: 3, per: 1s}\n",
			[]string{`line 6`, `rule "r1"`, `limits[0]`, `concurrent and timeout only`}},
		{"two inflight", head + "  - id: r1\n    limits:\n      - {name: a, concurrent: 5, timeout: 30s}\n      - {name: b, concurrent: 6, timeout: 30s}\n",
			[]string{`line 7`, `rule "r1"`, `limits[1].concurrent`, `at most one`}},
		{"quota without period", head + "  - id: r1\n    limits:\n      - {name: d, quota: 100}\n",
			[]string{`line 6`, `rule "r1"`, `limits[0].period`, `missing`}},
		{"quota bad period", head + "  - id: r1\n    limits:\n      - {name: d, quota: 100, period: fortnight}\n",
			[]string{`line 6`, `rule "r1"`, `limits[0].period`, `"fortnight", want day, week`}},
		{"quota bad zone", head + "  - id: r1\n    limits:\n      - {name: d, quota: 100, period: day, time_zone: Europe/Parus}\n",
			[]string{`line 6`, `rule "r1"`, `limits[0].time_zone`, `"Europe/Parus" is not an IANA time zone`}},
		{"quota local zone", head + "  - id: r1\n    limits:\n      - {name: d, quota: 100, period: day, time_zone: Local}\n",
			[]string{`line 6`, `limits[0].time_zone`, `depends on the machine`}},
		{"quota path zone", head + "  - id: r1\n    limits:\n      - {name: d, quota: 100, period: day, time_zone: ../../etc/passwd}\n",
			[]string{`line 6`, `limits[0].time_zone`, `not an IANA time zone`}},
		{"quota zero", head + "  - id: r1\n    limits:\n      - {name: d, quota: 0, period: day}\n",
			[]string{`line 6`, `limits[0].quota`, `0, must be in [1, `}},
		{"quota fractional", head + "  - id: r1\n    limits:\n      - {name: d, quota: 2.5, period: day}\n",
			[]string{`line 6`, `limits[0].quota`, `2.5, want a whole number`}},
		{"quota with per", head + "  - id: r1\n    limits:\n      - {name: d, quota: 5, period: day, per: 1s}\n",
			[]string{`line 6`, `limits[0].quota`, `quota, period and time_zone only`}},
		{"too many limits", head + "  - id: r1\n    limits: [" + strings.Repeat("{name: a, rate: 1, per: 1s},", 9) + "]\n",
			[]string{`line 5`, `rule "r1"`, `limits: 9 limits, more than 8`}},
		{"duplicate limit name", head + "  - id: r1\n    limits:\n      - {name: s, rate: 1, per: 1s}\n      - {name: s, rate: 2, per: 1m}\n",
			[]string{`line 7`, `rule "r1"`, `limits[1].name`, `twice`}},
		{"negative rate", head + "  - id: r1\n    limits:\n      - name: s\n        per: 1s\n        rate: -1\n",
			[]string{`line 8`, `rule "r1"`, `limits[0].rate`, `-1, must be finite and > 0`}},
		{"nan rate", head + "  - id: r1\n    limits:\n      - {name: s, rate: .nan, per: 1s}\n",
			[]string{`line 6`, `rule "r1"`, `limits[0].rate`, `NaN`}},
		{"inf burst", head + "  - id: r1\n    limits:\n      - {name: s, rate: 1, per: 1s, burst: .inf}\n",
			[]string{`line 6`, `rule "r1"`, `limits[0].burst`, `+Inf`}},
		{"rate too high", head + "  - id: r1\n    limits:\n      - {name: s, rate: 1e9, per: 1ms}\n",
			[]string{`line 6`, `rule "r1"`, `limits[0].rate`, `more than 1e+09`}},
		{"burst too high", head + "  - id: r1\n    limits:\n      - {name: s, rate: 1, per: 1s, burst: 1e13}\n",
			[]string{`rule "r1"`, `limits[0].burst`, `1e+13`}},
		{"zero per", head + "  - id: r1\n    limits:\n      - {name: s, rate: 1, per: 0s}\n",
			[]string{`line 6`, `rule "r1"`, `limits[0].per`, `0s`}},
		{"burst below one", head + "  - id: r1\n    limits:\n      - {name: s, rate: 0.5, per: 1s}\n",
			[]string{`line 6`, `rule "r1"`, `limits[0].burst`, `missing, and rate 0.5`}},
		{"share out of range", head + "  - id: r1\n    shares: {us-east: 1.5}\n    limits: [{name: s, rate: 1, per: 1s}]\n",
			[]string{`line 5`, `rule "r1"`, `shares`, `us-east`, `1.5`}},
		{"bad region", head + "  - id: r1\n    shares: {US_East: 0.5}\n    limits: [{name: s, rate: 1, per: 1s}]\n",
			[]string{`line 5`, `rule "r1"`, `shares`, `US_East`}},
		{"bad id", head + "  - id: a/b\n    limits: [{name: s, rate: 1, per: 1s}]\n",
			[]string{`line 4`, `rule "a/b"`, `id`}},
		{"duplicate key", head + "  - id: r1\n    id: r2\n", []string{`line 5`, `rule "r1"`, `already defined`}},
		{"second document", head + "---\nrules: []\n", []string{`second YAML document`}},
		{"empty", "", []string{`empty document`}},
		{"not a mapping", "- 1\n", []string{`line 1`, `rule set`}},
		{"rule not a mapping", "rules:\n  - hello\n", []string{`line 2`, `a rule (a mapping)`}},
		{"syntax", "rules: [\n", []string{`line 1`, `did not find expected node content`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := ParseYAML([]byte(tt.in))
			if err == nil {
				_, err = Compile(s, CompileOptions{})
			}
			if err == nil {
				t.Fatalf("accepted:\n%s", tt.in)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error does not wrap ErrInvalid: %v", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\n does not contain %q", err, w)
				}
			}
		})
	}
}

// A file with several problems lists them all, with the file name and lines.
func TestCheckFileListsEveryError(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "bad.yaml")
	in := "rules:\n  - id: a\n    limits: [{name: s, rate: -1, per: 1s}]\n  - id: b\n    limits:\n      - {name: s, rate: 1, per: 1s}\n      - {name: s, rate: 1, per: 1m}\n"
	if err := os.WriteFile(path, []byte(in), 0o600); err != nil {
		t.Fatal(err)
	}
	err := CheckFile(path)
	if err == nil {
		t.Fatal("accepted")
	}
	for _, w := range []string{path + `:3: rule "a": limits[0].rate`, path + `:7: rule "b": limits[1].name`} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%q does not contain %q", err, w)
		}
	}
	if err := CheckFile(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("missing file: %v", err)
	}
}

// Rules built in Go (no positions) are validated the same way.
func TestValidateGoRules(t *testing.T) {
	s := &Set{Rules: []Rule{
		{ID: "a", Limits: []LimitSpec{{Name: "s", Rate: math.Inf(1), Per: time.Second}}},
		{ID: "b", By: 9, Limits: []LimitSpec{{Name: "s", Rate: 1, Per: time.Second}}},
	}}
	err := s.Validate()
	if err == nil || !strings.Contains(err.Error(), `rule "a": limits[0].rate: +Inf`) || !strings.Contains(err.Error(), `rule "b": by: 9`) {
		t.Fatalf("got %v", err)
	}
	if _, err := Compile(s, CompileOptions{}); err == nil {
		t.Fatal("compiled a bad set")
	}
	if _, err := Compile(&Set{}, CompileOptions{Region: "us-east", Regions: map[string]float64{"us-east": 0}}); err == nil || !strings.Contains(err.Error(), `region "us-east" weight 0`) {
		t.Fatalf("bad options: %v", err)
	}
	if _, err := Compile(&Set{}, CompileOptions{Region: "us-west", Regions: map[string]float64{"us-east": 1}}); err == nil || !strings.Contains(err.Error(), `Region "us-west" is not one of CompileOptions.Regions (us-east)`) {
		t.Fatalf("bad options: %v", err)
	}
	if _, err := Compile(&Set{}, CompileOptions{IPv6Prefix: 129}); err == nil || !strings.Contains(err.Error(), "IPv6Prefix 129") {
		t.Fatalf("bad options: %v", err)
	}
}

func TestTooManyErrorsAreCapped(t *testing.T) {
	var b strings.Builder
	b.WriteString("rules:\n")
	for range 50 {
		b.WriteString("  - limits: [{name: s, rate: 1, per: 1s}]\n")
	}
	_, err := Compile(mustParse(t, b.String()), CompileOptions{})
	if err == nil || !strings.Contains(err.Error(), "and 30 more errors") {
		t.Fatalf("got %v", err)
	}
}

func mustParse(t testing.TB, in string) *Set {
	t.Helper()
	s, err := ParseYAML([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustCompile(t testing.TB, in string, opt CompileOptions) *Snapshot {
	t.Helper()
	snap, err := Compile(mustParse(t, in), opt)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// An in-flight limit parses, compiles apart from the rule's buckets, and its regional cap
// is floor(global × share).
func TestInflightLimit(t *testing.T) {
	s, err := ParseYAML([]byte("rules:\n  - id: exp\n    limits:\n      - {name: second, rate: 5, per: 1s}\n      - {name: inflight, concurrent: 20, timeout: 30s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if l := s.Rules[0].Limits[1]; !l.IsInflight() || l.Concurrent != 20 || l.Timeout != 30*time.Second {
		t.Fatalf("parsed as %+v", l)
	}
	snap, err := Compile(s, CompileOptions{Region: "b", Regions: map[string]float64{"a": 1, "b": 1, "c": 1}})
	if err != nil {
		t.Fatal(err)
	}
	c := snap.Rule("exp")
	if c == nil || c.Inflight == nil || len(c.Global) != 1 || len(c.Limits) != 1 {
		t.Fatalf("compiled as %+v", c)
	}
	in := c.Inflight
	if in.Name != "exp/inflight" || in.Global != 20 || in.Cap != 6 || in.Timeout != 30*time.Second {
		t.Fatalf("in-flight compiled as %+v, want cap floor(20/3) = 6", in)
	}
	for _, tc := range []struct {
		share float64
		want  int64
	}{{1, 20}, {0.5, 10}, {0.3, 6}, {0.049, 0}, {0.05, 1}, {0, 0}, {math.NaN(), 0}, {2, 20}} {
		if got := in.CapFor(tc.share); got != tc.want {
			t.Errorf("CapFor(%v) = %d, want %d", tc.share, got, tc.want)
		}
	}
	// A rule of only an in-flight limit compiles with no buckets.
	s, err = ParseYAML([]byte("rules:\n  - id: only\n    limits: [{name: c, concurrent: 3, timeout: 1m}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if snap, err = Compile(s, CompileOptions{}); err != nil {
		t.Fatal(err)
	}
	if c := snap.Rule("only"); len(c.Global) != 0 || c.Inflight == nil || c.Inflight.Cap != 3 {
		t.Fatalf("compiled as %+v", c)
	}
	// The rule file written back reads the same.
	if back, err := ParseYAML(EncodeSet(s)); err != nil || back.Rules[0].Limits[0] != s.Rules[0].Limits[0] {
		t.Fatalf("EncodeSet round trip: %v, %+v", err, back)
	}
}
