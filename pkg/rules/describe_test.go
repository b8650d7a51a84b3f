package rules

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// TestDescribe (issue 28, item 9): a balancer logged "rules rejected" when etcd was merely
// unreachable; a refused rule and an unreachable source are now told apart.
func TestDescribe(t *testing.T) {
	_, bad := ParseRule([]byte(`{"limits":[{"name":"s","rate":0,"per":"1s"}]}`))
	if bad == nil {
		bad = CheckYAML([]byte("rules:\n  - id: x\n    limits: [{name: s, rate: 0, per: 1s}]\n"), "f", CompileOptions{})
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{bad, "rules refused; the rules in force keep serving"},
		{fmt.Errorf("rules: while listing /allot/rules/ in etcd: %w", context.DeadlineExceeded), "rules source unreachable; the rules in force keep serving"},
		{fmt.Errorf("%w: %w", errUnreachable, context.DeadlineExceeded), "rules source unreachable; the rules in force keep serving"},
	} {
		if got := Describe(tc.err); got != tc.want {
			t.Errorf("Describe(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// TestCheckEtcd (issue 28, item 4): the admin API's check of etcd's rules refuses keys
// alone, as an EtcdSource does, and fails whole only for the whole set.
func TestCheckEtcd(t *testing.T) {
	kvs := map[string][]byte{
		"/r/default": []byte(`{"limits":[{"name":"s","rate":10,"per":"1s"}]}`),
		"/r/k1":      []byte(`{"match":{"api_key":"k1"},"limits":[{"name":"s","rate":10,"per":"1s"}]}`),
		"/r/a":       []byte(`{"id":"dup","limits":[{"name":"s","rate":1,"per":"1s"}]}`),
		"/r/b":       []byte(`{"id":"dup","limits":[{"name":"s","rate":1,"per":"1s"}]}`),
		"/r/junk":    []byte(`[1, 2`),
	}
	refused, err := CheckEtcd("/r/", kvs, nil, CompileOptions{})
	if err != nil {
		t.Fatalf("whole set: %v", err)
	}
	if len(refused) != 3 || refused["/r/k1"] == nil || refused["/r/b"] == nil || refused["/r/junk"] == nil {
		t.Fatalf("refused %v, want k1 (no expires_at), b (dup of a) and junk", refused)
	}
	for k, want := range map[string]string{"/r/k1": "expires_at", "/r/b": `"dup" is also the id of the rule at /r/a`} {
		if !strings.Contains(refused[k].Error(), want) {
			t.Errorf("%s: %v, want %q", k, refused[k], want)
		}
	}
}
