package rules

import (
	"reflect"
	"strings"
	"testing"
)

// settle: true is read, kept through both encodings, compiled, and refused beside no rate
// limit.
func TestSettleRule(t *testing.T) {
	s := mustParse(t, `
rules:
  - id: llm-done
    match: {domain: llm, descriptor: [{key: api_key}, {key: phase, value: done}]}
    limits: [{name: minute, rate: 1000, per: 1m}]
    settle: true
`)
	r := s.Rules[0]
	if !r.Settle {
		t.Fatalf("settle not read: %+v", r)
	}
	r.pos = nil
	b, err := EncodeRule(&r)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseRule(b)
	if err != nil {
		t.Fatal(err)
	}
	got.pos = nil
	if !reflect.DeepEqual(*got, r) {
		t.Fatalf("JSON round trip of %s: %+v", b, *got)
	}
	if back, err := ParseYAML(EncodeSet(s)); err != nil || !back.Rules[0].Settle {
		t.Fatalf("YAML round trip: %v", err)
	}
	snap, err := Compile(s, CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := snap.Rule("llm-done"); c == nil || !c.Settle {
		t.Fatalf("compiled: %+v", c)
	}
	for _, tc := range []struct{ name, yaml, want string }{
		{"unlimited", "  - id: x\n    unlimited: true\n    settle: true\n", `rule "x": settle: beside unlimited or refuse: true`},
		{"only in-flight", "  - id: x\n    limits: [{name: c, concurrent: 2, timeout: 10s}]\n    settle: true\n", `rule "x": settle: beside only an in-flight limit`},
	} {
		_, err := ParseYAMLAt([]byte("rules:\n"+tc.yaml), "r.yaml")
		if err == nil {
			var set *Set
			set, _ = ParseYAMLAt([]byte("rules:\n"+tc.yaml), "r.yaml")
			err = set.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
