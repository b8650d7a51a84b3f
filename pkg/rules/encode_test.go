package rules

import (
	"reflect"
	"strings"
	"testing"
)

// EncodeRule's output parses back into the rule it came from, for every rule of the
// example-like set below.
func TestEncodeRuleRoundTrip(t *testing.T) {
	s, err := ParseYAML([]byte(`
rules:
  - id: default
    limits:
      - {name: second, rate: 20, per: 1s, burst: 40}
      - {name: hour, rate: 1000, per: 1h30m}
    reason: baseline
  - id: acme
    match: {api_key: k1, plan: pro, endpoint: "GET /v1/x", org: o, ip: 10.0.0.0/8}
    by: org
    limits: [{name: second, rate: 500, per: 1m}]
    cost: {"GET /v1/x": 2}
    mode: shadow
    fail_mode: closed
    expires_at: 2030-01-01T00:00:00Z
    shares: {us-east: 0.5}
  - id: abuse
    limits: [{name: second, rate: 5, per: 1s}]
    penalty: {refusals: 1000, within: 1m, block: 10m}
`))
	if err != nil {
		t.Fatal(err)
	}
	for i := range s.Rules {
		want := s.Rules[i]
		want.pos = nil
		b, err := EncodeRule(&want)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseRule(b)
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		got.pos = nil
		if !reflect.DeepEqual(*got, want) {
			t.Errorf("round trip of %s:\n got %+v\nwant %+v", b, *got, want)
		}
	}
}

// EtcdSet layers etcd rules over a base the way EtcdSource does, and a bad value names
// its key.
func TestEtcdSet(t *testing.T) {
	base := &Set{Rules: []Rule{{ID: "a", Limits: []LimitSpec{{Name: "s", Rate: 1, Per: 1e9}}}}}
	s, err := EtcdSet("/r/", map[string][]byte{
		"/r/a": []byte(`{"limits":[{"name":"s","rate":5,"per":"1s"}]}`),
		"/r/b": []byte(`{"limits":[{"name":"s","rate":2,"per":"1s"}]}`),
	}, base)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Rules) != 2 || s.Rules[0].ID != "a" || s.Rules[0].Limits[0].Rate != 5 || s.Rules[1].ID != "b" {
		t.Fatalf("rules %+v", s.Rules)
	}
	_, err = EtcdSet("/r/", map[string][]byte{"/r/c": []byte("{\n\"limits\": [{\"name\": \"s\", \"rate\": 2, \"per\": \"1s\"}],\n\"colour\": 1\n}")}, nil)
	if err == nil || err.Error() != `rules: /r/c:3: rule #1 (no id): colour: unknown field "colour"` {
		t.Fatalf("error %v", err)
	}
}

// EncodeSet's file parses back into the rules it came from.
func TestEncodeSetRoundTrip(t *testing.T) {
	s := mustParse(t, specificitySet+strings.TrimPrefix(descriptorSet, "\nrules:\n")+
		"  - id: abuse\n    limits: [{name: second, rate: 5, per: 1s}]\n    penalty: {refusals: 1000, within: 1m, block: 10m}\n")
	back, err := ParseYAML(EncodeSet(s))
	if err != nil {
		t.Fatalf("%v\n%s", err, EncodeSet(s))
	}
	if back.Version != s.Version || len(back.Rules) != len(s.Rules) {
		t.Fatalf("version %q, %d rules", back.Version, len(back.Rules))
	}
	for i := range s.Rules {
		want, got := s.Rules[i], back.Rules[i]
		want.pos, got.pos = nil, nil
		if !reflect.DeepEqual(got, want) {
			t.Errorf("rule %d:\n got %+v\nwant %+v", i, got, want)
		}
	}
}
