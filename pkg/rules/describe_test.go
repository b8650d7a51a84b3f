package rules

import (
	"context"
	"fmt"
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
