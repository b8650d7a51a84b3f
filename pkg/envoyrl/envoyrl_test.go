package envoyrl

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The configuration examples of envoyproxy/ratelimit's README ("Examples"), written out
// here as fixtures in its format; each loads without error or warning.
var readmeExamples = map[string]string{
	"example1": `
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
`,
	"example2": `
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
`,
	"example3": `
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
`,
	"example4": `
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
`,
	"example5": `
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true
  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
`,
	"example6": `
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
`,
	"example7": `
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
`,
	"example8": `
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
`,
	"example9": `
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: path
    value: /api/*/action
    rate_limit: {unit: minute, requests_per_unit: 20}
`,
	"example10": `
domain: example10
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit:
              unit: minute
              requests_per_unit: 60
`,
	"share_threshold": `
domain: files
descriptors:
  - key: path
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 100}
    metadata:
      team: storage
      tiers: [1, 2]
`,
	"quota_mode and YAML 1.1 booleans": `
domain: quota
descriptors:
  - key: tenant
    quota_mode: yes
    shadow_mode: off
    rate_limit: {unit: WEEK, requests_per_unit: 7}
`,
	"no descriptors": `domain: empty`,
}

func TestReadmeExamples(t *testing.T) {
	for name, y := range readmeExamples {
		t.Run(name, func(t *testing.T) {
			cfg, err := Parse(name+".yaml", []byte(y))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if len(cfg.Warnings) > 0 {
				t.Errorf("warnings: %q", cfg.Warnings)
			}
			if cfg.Domain == "" || cfg.File != name+".yaml" {
				t.Errorf("domain %q, file %q", cfg.Domain, cfg.File)
			}
		})
	}
}

func TestModel(t *testing.T) {
	cfg, err := Parse("e7.yaml", []byte(readmeExamples["example7"]))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Domain != "example7" || len(cfg.Descriptors) != 2 {
		t.Fatalf("got %+v", cfg)
	}
	d := cfg.Descriptors[1]
	if d.Key != "key_2" || d.Value != "value_2" || d.Line != 13 || d.CompositeKey() != "key_2_value_2" {
		t.Errorf("descriptor %+v", d)
	}
	rl := d.Descriptors[0].RateLimit
	if rl == nil || rl.Unit != UnitSecond || rl.RequestsPerUnit != 10 || len(rl.Replaces) != 1 || rl.Replaces[0] != "specific_limit" {
		t.Errorf("rate limit %+v", rl)
	}
	if n := cfg.Descriptors[0].Descriptors[0].RateLimit.Name; n != "specific_limit" {
		t.Errorf("name %q", n)
	}

	cfg, err = Parse("e5.yaml", []byte(readmeExamples["example5"]))
	if err != nil {
		t.Fatal(err)
	}
	if rl := cfg.Descriptors[0].RateLimit; !rl.Unlimited || rl.Unit != UnitUnknown {
		t.Errorf("unlimited %+v", rl)
	}

	cfg, err = Parse("q.yaml", []byte(readmeExamples["quota_mode and YAML 1.1 booleans"]))
	if err != nil {
		t.Fatal(err)
	}
	if d := cfg.Descriptors[0]; !d.QuotaMode || d.ShadowMode || d.RateLimit.Unit != UnitWeek {
		t.Errorf("descriptor %+v", d)
	}

	cfg, err = Parse("s.yaml", []byte(readmeExamples["share_threshold"]))
	if err != nil {
		t.Fatal(err)
	}
	if d := cfg.Descriptors[0]; !d.ShareThreshold || d.Metadata["team"] != "storage" {
		t.Errorf("descriptor %+v", d)
	}

	cfg, err = Parse("v.yaml", []byte("domain: 42\ndescriptors:\n  - key: code\n    value: 200\n    shadow_mode: true\n    rate_limit: {unit: Second, requests_per_unit: 4294967295}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if d := cfg.Descriptors[0]; cfg.Domain != "42" || d.Value != "200" || d.RateLimit.RequestsPerUnit != 1<<32-1 || d.RateLimit.Unit != UnitSecond {
		t.Errorf("config %+v", cfg)
	}
}

func TestUnitDuration(t *testing.T) {
	day := 24 * time.Hour
	for s, want := range map[string]time.Duration{
		"second": time.Second, "MINUTE": time.Minute, "Hour": time.Hour, "day": day,
		"week": 7 * day, "month": 30 * day, "year": 365 * day,
	} {
		u, ok := ParseUnit(s)
		if !ok || u.Duration() != want {
			t.Errorf("%s: %v %v, want %v", s, u, u.Duration(), want)
		}
	}
	for _, s := range []string{"", "unknown", "ms", "seconds"} {
		if _, ok := ParseUnit(s); ok {
			t.Errorf("ParseUnit(%q) accepted", s)
		}
	}
	if UnitUnknown.Duration() != 0 {
		t.Error("unknown unit has a duration")
	}
}

// Each file envoyproxy/ratelimit refuses, and the message (file:line: ...) it gets here.
func TestInvalid(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"empty file", ``, []string{"bad.yaml:1: config file cannot have empty domain"}},
		{"no domain", "descriptors:\n  - key: a\n", []string{"bad.yaml:1: config file cannot have empty domain"}},
		{"empty domain", "domain: ''\n", []string{"bad.yaml:1: config file cannot have empty domain"}},
		{"syntax", "domain: a\ndescriptors: [\n", []string{"bad.yaml:2: yaml:"}},
		{"not a mapping", "- domain: a\n", []string{"bad.yaml:1: the file must be a mapping"}},
		{"unknown key at top", "domain: a\ndescriptor:\n  - key: a\n", []string{"bad.yaml:2: unknown key 'descriptor'"}},
		{"unknown key deep", "domain: a\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      request_per_unit: 5\n",
			[]string{"bad.yaml:6: unknown key 'request_per_unit'"}},
		{"key not a string", "domain: a\n1: x\n", []string{"bad.yaml:2: key is not a string: \"1\""}},
		{"list of scalars", "domain: a\ndescriptors:\n  - a\n", []string{"bad.yaml:3: list 'descriptors' holds \"a\""}},
		{"float", "domain: a\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n",
			[]string{"bad.yaml:4: 'requests_per_unit': 1.5 is a float"}},
		{"negative", "domain: a\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
			[]string{"bad.yaml:4: 'requests_per_unit' must be an integer from 0 to 4294967295"}},
		{"too big", "domain: a\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n",
			[]string{"bad.yaml:4: 'requests_per_unit' must be an integer"}},
		{"no key", "domain: a\ndescriptors:\n  - value: b\n", []string{"bad.yaml:3: descriptor has no key"}},
		{"empty key", "domain: a\ndescriptors:\n  - key: ''\n", []string{"bad.yaml:3: descriptor has empty key"}},
		{"duplicate", "domain: a\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
			[]string{"bad.yaml:5: duplicate descriptor composite key 'k_v' (first at line 3)"}},
		{"duplicate composite", "domain: a\ndescriptors:\n  - key: k\n    value: v_w\n  - key: k_v\n    value: w\n",
			[]string{"bad.yaml:5: duplicate descriptor composite key 'k_v_w'"}},
		{"duplicate nested", "domain: a\ndescriptors:\n  - key: k\n    descriptors:\n      - key: x\n      - key: x\n",
			[]string{"bad.yaml:6: duplicate descriptor composite key 'x'"}},
		{"bad unit", "domain: a\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: seconds\n      requests_per_unit: 5\n",
			[]string{"bad.yaml:5: invalid rate limit unit 'seconds'"}},
		{"no unit", "domain: a\ndescriptors:\n  - key: a\n    rate_limit:\n      requests_per_unit: 5\n",
			[]string{"bad.yaml:5: invalid rate limit unit ''"}},
		{"unknown unit", "domain: a\ndescriptors:\n  - key: a\n    rate_limit: {unit: unknown, requests_per_unit: 5}\n",
			[]string{"bad.yaml:4: invalid rate limit unit 'unknown'"}},
		{"unlimited with unit", "domain: a\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n      unit: minute\n",
			[]string{"bad.yaml:6: should not specify rate limit unit when unlimited"}},
		{"empty replaces", "domain: a\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1\n      replaces:\n        - name: ''\n",
			[]string{"bad.yaml:8: should not have an empty replaces entry"}},
		{"replaces itself", "domain: a\ndescriptors:\n  - key: a\n    rate_limit:\n      name: n\n      unit: minute\n      requests_per_unit: 1\n      replaces:\n        - name: n\n",
			[]string{"bad.yaml:5: replaces should not contain name of same descriptor ('n')"}},
		{"share_threshold without wildcard", "domain: a\ndescriptors:\n  - key: a\n    value: b\n    share_threshold: true\n",
			[]string{"bad.yaml:3: share_threshold can only be used with wildcard values"}},
		{"bool", "domain: a\ndescriptors:\n  - key: a\n    shadow_mode: 'yes'\n", []string{"bad.yaml:4: 'shadow_mode' must be true or false"}},
		{"descriptors not a list", "domain: a\ndescriptors: many\n", []string{"bad.yaml:2: 'descriptors' must be a list"}},
		{"rate_limit not a mapping", "domain: a\ndescriptors:\n  - key: a\n    rate_limit: fast\n", []string{"bad.yaml:4: 'rate_limit' must be a mapping"}},
		{"key a mapping", "domain: a\ndescriptors:\n  - key: {a: b}\n", []string{"bad.yaml:3: unknown key 'a'", "bad.yaml:3: 'key' must be a string"}},
		{"every problem", "domain: ''\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight}\n  - key: a\n    colour: red\n",
			[]string{"bad.yaml:1: config file cannot have empty domain", "bad.yaml:4: invalid rate limit unit 'fortnight'",
				"bad.yaml:5: duplicate descriptor composite key 'a'", "bad.yaml:6: unknown key 'colour'"}},
		{"billion laughs", laughs(), []string{"too large once its aliases are expanded"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse("bad.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatalf("accepted: %+v", cfg)
			}
			if cfg != nil {
				t.Errorf("a config beside the error")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%v does not wrap ErrInvalid", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func laughs() string {
	var b strings.Builder
	b.WriteString("a0: &a0 {key: x}\n")
	for i := 1; i < 30; i++ {
		b.WriteString("a" + itoa(i) + ": &a" + itoa(i) + " {key: k, descriptors: [")
		for j := 0; j < 9; j++ {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString("*a" + itoa(i-1))
		}
		b.WriteString("]}\n")
	}
	return b.String() + "domain: a\ndescriptors:\n  - *a29\n"
}

func itoa(i int) string { return strconv.Itoa(i) }

// What envoyproxy/ratelimit accepts but ignores is accepted, with a warning.
func TestWarnings(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"misplaced key", "domain: a\nunit: second\n", "w.yaml:2: key 'unit' has no meaning in the file's top level"},
		{"repeated key", "domain: a\ndomain: b\n", "w.yaml:2: key 'domain' repeats the one of line 1"},
		{"unlimited with bad unit", "domain: a\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: bogus}\n", "unit 'bogus' beside unlimited: true is ignored"},
		{"unlimited with requests", "domain: a\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, requests_per_unit: 5}\n", "requests_per_unit beside unlimited: true is ignored"},
		{"no requests", "domain: a\ndescriptors:\n  - key: a\n    rate_limit: {unit: second}\n", "w.yaml:4: rate_limit has no requests_per_unit"},
		{"replaces unknown", "domain: a\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: other}]}\n", "replaces 'other', a name no rate_limit of this file has"},
		{"shadow without limit", "domain: a\ndescriptors:\n  - key: a\n    shadow_mode: true\n", "w.yaml:3: shadow_mode without a rate_limit has no effect"},
		{"second document", "domain: a\n---\ndomain: b\n", "a second YAML document"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse("w.yaml", []byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(strings.Join(cfg.Warnings, "\n"), tc.want) {
				t.Errorf("warnings %q do not say %q", cfg.Warnings, tc.want)
			}
		})
	}
}

func TestMergeKey(t *testing.T) {
	y := "domain: a\ndescriptors:\n  - key: a\n    rate_limit: &rl {unit: second, requests_per_unit: 3}\n  - key: b\n    rate_limit:\n      <<: *rl\n      requests_per_unit: 9\n"
	cfg, err := Parse("m.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	if rl := cfg.Descriptors[1].RateLimit; rl.Unit != UnitSecond || rl.RequestsPerUnit != 9 {
		t.Errorf("merged %+v", rl)
	}
}

func writeDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for n, y := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestLoadDir(t *testing.T) {
	dir := writeDir(t, map[string]string{
		"a.yaml":     readmeExamples["example1"],
		"b.yml":      readmeExamples["example2"],
		".hidden":    "nonsense: [",
		"notes.txt":  "not yaml: [",
		"c.yaml.bak": "not: [",
	})
	cfgs, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfgs) != 2 || cfgs[0].Domain != "mongo_cps" || cfgs[1].Domain != "messaging" {
		t.Fatalf("got %d configs", len(cfgs))
	}

	dup := map[string]string{
		"a.yaml": "domain: d\ndescriptors:\n  - key: x\n",
		"b.yaml": "\ndomain: d\ndescriptors:\n  - key: y\n",
	}
	_, err = LoadDir(writeDir(t, dup))
	if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "b.yaml:2: duplicate domain 'd' in config file") {
		t.Errorf("duplicate domain: %v", err)
	}
	cfgs, err = LoadDirMerged(writeDir(t, dup))
	if err != nil || len(cfgs) != 1 || len(cfgs[0].Descriptors) != 2 || cfgs[0].Descriptors[1].Key != "y" {
		t.Errorf("merged: %v %+v", err, cfgs)
	}
	dup["b.yaml"] = "domain: d\ndescriptors:\n  - key: x\n"
	_, err = LoadDirMerged(writeDir(t, dup))
	if err == nil || !strings.Contains(err.Error(), "b.yaml:3: duplicate descriptor composite key 'd.x'") {
		t.Errorf("merged duplicate: %v", err)
	}

	_, err = LoadDir(writeDir(t, map[string]string{"a.yaml": "domain: a\nfoo: 1\n", "b.yaml": ""}))
	if err == nil || !strings.Contains(err.Error(), "a.yaml:2: unknown key 'foo'") || !strings.Contains(err.Error(), "b.yaml:1: config file cannot have empty domain") {
		t.Errorf("errors of every file: %v", err)
	}
	if _, err := LoadDir(filepath.Join(t.TempDir(), "missing")); err == nil || !errors.Is(err, ErrInvalid) {
		t.Errorf("missing directory: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	for _, y := range readmeExamples {
		f.Add([]byte(y))
	}
	f.Add([]byte("domain: a\ndescriptors:\n  - key: a\n    rate_limit: &x {<<: *x}\n"))
	f.Add([]byte(laughs()))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse("f.yaml", data)
		if (cfg == nil) == (err == nil) {
			t.Fatalf("config %v and error %v", cfg, err)
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Fatalf("%v does not wrap ErrInvalid", err)
		}
	})
}

func TestReadDir(t *testing.T) {
	dir := writeDir(t, map[string]string{
		"a.yaml":    readmeExamples["example1"],
		"notes.txt": "not yaml: [",
		".hidden":   "nonsense: [",
	})
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "..data"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "..data", "b.yaml"), []byte(readmeExamples["example2"]), 0o644); err != nil {
		t.Fatal(err)
	}
	// A ConfigMap mount: the file is a symbolic link into the dot directory.
	if err := os.Symlink(filepath.Join("..data", "b.yaml"), filepath.Join(dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	files, skipped, err := ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 || filepath.Base(files[0].Name) != "a.yaml" || filepath.Base(files[1].Name) != "b.yaml" || !strings.Contains(string(files[1].Data), "messaging") {
		t.Fatalf("files %+v", files)
	}
	if len(skipped) != 2 || filepath.Base(skipped[0]) != "notes.txt" || filepath.Base(skipped[1]) != "sub" {
		t.Errorf("skipped %q, want notes.txt and sub", skipped)
	}
	cfgs, err := ParseFiles(files, false)
	if err != nil || len(cfgs) != 2 || cfgs[1].Domain != "messaging" {
		t.Fatalf("ParseFiles: %v %+v", err, cfgs)
	}
	if _, _, err := ReadDir(filepath.Join(dir, "missing")); err == nil || !errors.Is(err, ErrInvalid) {
		t.Errorf("missing directory: %v", err)
	}
}
