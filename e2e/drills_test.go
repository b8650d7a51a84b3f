package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/e2e/stack"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// TestDrills is issue 11's failure drills on one three-region stack (e2e/stack): each
// subtest breaks one thing and fails when the promise it names breaks, logging its
// figures (docs/drills.md lists them). They share the stack to keep `make test` lean, so
// they run in this order, the destructive ones last, and a subtest leaves the stack whole
// for the next (or says what it left). -run TestDrills/<name> runs one drill alone on a
// fresh stack.
//
// Layout: us-east (home of etcd and the nginx gateway; 3 masters × 1 replica, for the
// failover drill), eu-west (behind the Caddy gateway) and ap-south (3 masters, no
// replica), two enforcers each;
// eu-west and ap-south reach etcd through 40 ms / 70 ms each-way Toxiproxy links.
func TestDrills(t *testing.T) {
	began := time.Now()
	opt := stack.DefaultOptions()
	opt.Regions[0].Replicas = 1
	opt.Gateway = true // nginx in front of us-east
	opt.Caddy = true   // Caddy in front of eu-west
	s := stack.Start(t, opt)
	t.Logf("drills: stack up in %v", time.Since(began).Round(time.Millisecond))

	baseline := startedAt(t, s)
	t.Run("gateway", func(t *testing.T) { drillGateway(t, s.Gateway) })
	t.Run("gateway-caddy", func(t *testing.T) { drillGateway(t, s.Caddy) })
	t.Run("bad-input", func(t *testing.T) { drillBadInput(t, s, baseline) })
	t.Run("rule-propagation", func(t *testing.T) { drillRulePropagation(t, s) })
	t.Run("enforcer-killed", func(t *testing.T) { drillEnforcerKilled(t, s) })
	t.Run("enforcer-killed-inflight", func(t *testing.T) { drillEnforcerKilledInflight(t, s) })
	t.Run("redis-primary-killed", func(t *testing.T) { drillRedisPrimaryKilled(t, s) })
	t.Run("etcd-down", func(t *testing.T) { drillEtcdDown(t, s) })
	t.Logf("drills: all done in %v", time.Since(began).Round(time.Millisecond))
}

// startedAt is every enforcer's last start time, to prove later that none restarted.
func startedAt(t *testing.T, s *stack.Stack) map[string]time.Time {
	out := map[string]time.Time{}
	for _, e := range s.Enforcers() {
		out[e.ID] = e.Proc.Status(t).StartedAt
	}
	return out
}

// noneRestarted fails t if an enforcer of baseline is not running or started again.
func noneRestarted(t *testing.T, s *stack.Stack, baseline map[string]time.Time) {
	t.Helper()
	for _, e := range s.Enforcers() {
		want, ok := baseline[e.ID]
		if !ok {
			continue
		}
		st := e.Proc.Status(t)
		if !st.Running || !st.StartedAt.Equal(want) || st.Restarts != 0 {
			t.Errorf("enforcer %s: running %v, started %v (was %v), restarts %d; last log lines:\n%s",
				e.ID, st.Running, st.StartedAt, want, st.Restarts, e.Proc.Logs(20))
		}
	}
}

// req builds a check for plan with api key key.
func req(plan, key, endpoint string) *allotv1.CheckRequest {
	return &allotv1.CheckRequest{ApiKey: key, Plan: plan, Endpoint: endpoint, Ip: "198.51.100.7"}
}

// waitRule polls every enforcer until a check of plan decides by rule id, and returns how
// long each took from since (the P5 figure), failing t after limit.
func waitRule(t *testing.T, s *stack.Stack, since time.Time, plan, key, id string, limit time.Duration) map[string]time.Duration {
	t.Helper()
	got := map[string]time.Duration{}
	type hit struct {
		id string
		d  time.Duration
	}
	ch := make(chan hit)
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	es := s.Enforcers()
	for _, e := range es {
		go func() {
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				resp, err := e.Check(t, ctx, req(plan, key, ""))
				if err == nil && resp.GetRule() == id {
					ch <- hit{e.ID, time.Since(since)}
					return
				}
				select {
				case <-ctx.Done():
					ch <- hit{e.ID, -1}
					return
				case <-tick.C:
				}
			}
		}()
	}
	for range es {
		h := <-ch
		got[h.id] = h.d
	}
	for id2, d := range got {
		if d < 0 {
			t.Errorf("enforcer %s: rule %s not enforced within %v", id2, id, limit)
		}
	}
	return got
}

// maxOf is the largest duration of m, and whose.
func maxOf(m map[string]time.Duration) (string, time.Duration) {
	var who string
	var best time.Duration
	for k, v := range m {
		if v >= best {
			who, best = k, v
		}
	}
	return who, best
}

// byRegion formats per-enforcer durations grouped by region, for the log.
func byRegion(s *stack.Stack, m map[string]time.Duration) string {
	var parts []string
	for _, r := range s.Regions {
		var ds []string
		for _, e := range r.Enforcers {
			if d, ok := m[e.ID]; ok {
				ds = append(ds, d.Round(time.Millisecond).String())
			}
		}
		parts = append(parts, fmt.Sprintf("%s %s", r.Name, strings.Join(ds, "/")))
	}
	return strings.Join(parts, ", ")
}
