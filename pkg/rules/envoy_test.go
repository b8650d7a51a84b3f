package rules

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/allot-dev/allot/pkg/envoyrl"
)

// envoyDir holds envoyproxy/ratelimit's README examples, one domain a file, in their
// runtime layout (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config).
const envoyDir = "../../configs/envoy-ratelimit/config"

func envoySnapshot(t testing.TB) *Snapshot {
	t.Helper()
	cfgs, err := envoyrl.LoadDir(envoyDir)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := Compile(FromEnvoy(cfgs), CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

func TestFromEnvoyRules(t *testing.T) {
	snap := envoySnapshot(t)
	byID := map[string]*Compiled{}
	for _, r := range snap.Rules() {
		byID[r.ID] = r
	}
	m := byID["messaging.message_type_marketing.to_number"]
	if m == nil || m.By != ByDescriptor || m.Match.Domain != "messaging" || len(m.Global) != 1 ||
		m.Global[0].Name != "messaging.message_type_marketing.to_number/day" || m.Global[0].Burst != 5 || m.Global[0].Rate != 5.0/86400 ||
		!strings.HasPrefix(m.Reason, "envoy-ratelimit ../../configs/envoy-ratelimit/config/messaging.yaml:8") {
		t.Fatalf("messaging rule %+v", m)
	}
	if r := byID["edge_proxy_per_ip.remote_address_50.0.0.5"]; r == nil || !r.Refuses() {
		t.Errorf("requests_per_unit 0: %+v", r)
	}
	if r := byID["internal.ldap"]; r == nil || !r.Unlimited {
		t.Errorf("unlimited: %+v", r)
	}
	if r := byID["example6.service.user_user-a"]; r == nil || r.Mode != ModeShadow {
		t.Errorf("shadow_mode: %+v", r)
	}
	if r := byID["example7.key_2_value_2.user_bkthomps"]; r == nil || len(r.Replaces) != 1 || r.Replaces[0] != "example7.key_1_value_1.user_bkthomps" {
		t.Errorf("replaces: %+v", r)
	}
	// Ids an id cannot hold as they are get what of them it can, and a hash.
	wild := regexp.MustCompile(`^example9\.path_-api---action@[0-9a-f]{8}$`)
	found := false
	for id := range byID {
		found = found || wild.MatchString(id)
		if !idRE.MatchString(id) {
			t.Errorf("id %q", id)
		}
	}
	if !found {
		t.Errorf("no id like %v among %v", wild, snap.Rules())
	}
}

// The README's requests, and the limit each gets (its rule's limit; "" none).
func TestFromEnvoyMatchesTheReadme(t *testing.T) {
	snap := envoySnapshot(t)
	for _, tc := range []struct {
		domain string
		kv     []string
		want   string // "<limit name> <identity>"
	}{
		{"mongo_cps", []string{"database", "users"}, "mongo_cps.database_users/second desc:mongo_cps/database=users"},
		{"mongo_cps", []string{"database", "other"}, ""},
		{"messaging", []string{"message_type", "marketing", "to_number", "2061111111"}, "messaging.message_type_marketing.to_number/day desc:messaging/message_type=marketing/to_number=2061111111"},
		{"messaging", []string{"to_number", "2061111111"}, "messaging.to_number/day desc:messaging/to_number=2061111111"},
		{"edge_proxy_per_ip", []string{"remote_address", "50.0.0.1"}, "edge_proxy_per_ip.remote_address/second desc:edge_proxy_per_ip/remote_address=50.0.0.1"},
		{"edge_proxy_per_ip", []string{"remote_address", "50.0.0.5"}, "edge_proxy_per_ip.remote_address_50.0.0.5/refuse desc:edge_proxy_per_ip/remote_address=50.0.0.5"},
		{"example4", []string{"key", "value", "subkey", "subvalue"}, "example4.key_value.subkey/second desc:example4/key=value/subkey=subvalue"},
		{"example4", []string{"key", "value"}, ""},
		{"internal", []string{"ldap", "x"}, ""},
		{"internal", []string{"azure", "x"}, "internal.azure/minute desc:internal/azure=x"},
		{"example6", []string{"service", "auth-service", "user", "user-a"}, "shadow example6.service.user_user-a/second desc:example6/service=auth-service/user=user-a"},
		{"example6", []string{"service", "auth-service", "user", "user-b"}, "example6.service.user_user-b/second desc:example6/service=auth-service/user=user-b"},
		{"example8", []string{"key1", "unspecified"}, "example8.key1/minute desc:example8/key1=unspecified"},
		{"example8", []string{"key1", "value1"}, "example8.key1_value1/minute desc:example8/key1=value1"},
		{"example9", []string{"key1", "valueXYZ"}, "* desc:example9/key1=valueXYZ"},
		{"example9", []string{"path", "/api/123/action"}, "* desc:example9/path=%2Fapi%2F123%2Faction"},
		{"example9", []string{"path", "/api/123/other"}, ""},
		{"example9", []string{"route", "/api/v1/resource/123/action"}, "* desc:example9/route=%2Fapi%2Fv1%2Fresource%2F123%2Faction"},
		{"example10", []string{"route", "api", "http_method", "GET", "subject_id", "123"}, "example10.route.http_method.subject_id/minute desc:example10/route=api/http_method=GET/subject_id=123"},
		{"example11", []string{"files", "files/a.pdf"}, "* desc:example11/files~files%2F*"},
		{"example11", []string{"files_no_share", "files_no_share/a.pdf"}, "* desc:example11/files_no_share=files_no_share%2Fa.pdf"},
	} {
		a := Attrs{Domain: tc.domain, Entries: entries(tc.kv...)}
		got := ""
		for _, m := range snap.Match(&a, t0, nil) {
			got = m.Rule.Limits[0].Name + " " + m.Identity
			if strings.Contains(m.Rule.ID, "@") {
				got = "* " + m.Identity // a hashed id: the identity says enough
			}
			if m.Rule.Mode == ModeShadow {
				got = "shadow " + got
			}
		}
		if got != tc.want {
			t.Errorf("%s %v: got %q, want %q", tc.domain, tc.kv, got, tc.want)
		}
	}
}

func TestFromEnvoyEdgeCases(t *testing.T) {
	parse := func(y string) *Set {
		t.Helper()
		cfg, err := envoyrl.Parse("e.yaml", []byte(y))
		if err != nil {
			t.Fatal(err)
		}
		return FromEnvoy([]*envoyrl.Config{cfg})
	}
	// A descriptor with neither rate_limit nor nested descriptors matches and limits
	// nothing, so the less specific sibling does not apply.
	snap, err := Compile(parse("domain: d\ndescriptors:\n  - key: k\n    value: free\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := ids(snap.Match(&Attrs{Domain: "d", Entries: entries("k", "free")}, t0, nil)); got != "" {
		t.Errorf("a limitless leaf: %s", got)
	}
	if got := ids(snap.Match(&Attrs{Domain: "d", Entries: entries("k", "other")}, t0, nil)); got != "d.k@desc:d/k=other×1" {
		t.Errorf("its sibling: %s", got)
	}
	// What a token bucket cannot hold is an error naming the file and the line.
	_, err = Compile(parse("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 4000000000\n"), CompileOptions{})
	if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `e.yaml:5: rule "d.k": limits[0].rate: 4e+09 per 1s is 4e+09 a second, more than 1e+09`) {
		t.Errorf("too fast: %v", err)
	}
	_, err = Compile(parse("domain: d\ndescriptors:\n  - key: k\n    value: "+strings.Repeat("v", 300)+"\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), CompileOptions{})
	if err == nil || !strings.Contains(err.Error(), "e.yaml:3: rule ") || !strings.Contains(err.Error(), "match.descriptor[0].value: 300 bytes, more than 256") {
		t.Errorf("too long: %v", err)
	}
	// quota_mode is quota: true, kept through a rule file.
	q := parse("domain: d\ndescriptors:\n  - key: k\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")
	if len(q.Rules) != 1 || !q.Rules[0].Quota {
		t.Fatalf("quota_mode: %+v", q.Rules)
	}
	if back, err := ParseYAML(EncodeSet(q)); err != nil || !back.Rules[0].Quota {
		t.Fatalf("quota through a rule file: %+v %v\n%s", back, err, EncodeSet(q))
	}
	// Two descriptors whose stats keys are one string get two ids.
	s := parse("domain: d\ndescriptors:\n  - key: a.b\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: second, requests_per_unit: 1}\n")
	if len(s.Rules) != 2 || s.Rules[0].ID != "d.a.b" || !strings.HasPrefix(s.Rules[1].ID, "d.a.b@") {
		t.Errorf("ids %q, %q", s.Rules[0].ID, s.Rules[1].ID)
	}
	if _, err := Compile(s, CompileOptions{}); err != nil {
		t.Error(err)
	}
}

// The converted rules, written out as a rule file and loaded again, are the same rules.
func TestFromEnvoyRoundTrip(t *testing.T) {
	cfgs, err := envoyrl.LoadDir(envoyDir)
	if err != nil {
		t.Fatal(err)
	}
	set := FromEnvoy(cfgs)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, EncodeSet(set), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := CheckFile(path); err != nil {
		t.Fatal(err)
	}
	back, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Rules) != len(set.Rules) {
		t.Fatalf("%d rules back, want %d", len(back.Rules), len(set.Rules))
	}
	for i := range set.Rules {
		want, _ := EncodeRule(&set.Rules[i])
		got, _ := EncodeRule(&back.Rules[i])
		if string(got) != string(want) {
			t.Errorf("rule %d:\n got %s\nwant %s", i, got, want)
		}
	}
	if testing.Verbose() {
		t.Logf("%s", EncodeSet(set))
	}
}
