package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/e2e/stack"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// drillEtcdDown: every etcd member stopped for longer than the registration TTL (5 s in
// the stack). Promises (P2, docs/design.md §8): enforcement continues on the last rules — a
// rule that exists only in etcd keeps being enforced everywhere, good traffic is allowed,
// no check fails, /readyz stays 200 (degraded); after etcd returns, a rule change reaches
// every enforcer again (recovery time reported).
func drillEtcdDown(t *testing.T, s *stack.Stack) {
	etcd := s.Etcd.Client(t)
	id := fmt.Sprintf("drill-etcd-%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	put := time.Now()
	_, err := etcd.Put(ctx, "/allot/rules/"+id, `{"match":{"plan":"etcd-drill"},"limits":[{"name":"second","rate":3,"per":"1s","burst":3}]}`)
	cancel()
	if err != nil {
		t.Fatalf("etcd put: %v", err)
	}
	waitRule(t, s, put, "etcd-drill", "etcd-probe", id, 10*time.Second)

	var stops []func(testing.TB)
	for _, m := range s.Etcd.Members {
		stops = append(stops, func(tb testing.TB) { m.Stop(tb) })
	}
	stack.Parallel(t, stops...)
	down := time.Now()

	// 8 s of checks on every enforcer: per round and enforcer one fresh key of the
	// etcd-only rule (burst 3: 5 checks → 3 allowed) and one good key of the drill rule.
	var calls, errs, overs, wrongRule, goodRefused int
	var firstErr error
	degraded := map[string]string{}
	for round := 0; time.Since(down) < 8*time.Second; round++ {
		for _, e := range s.Enforcers() {
			key := fmt.Sprintf("etcd-%s-%d", e.ID, round)
			allowed := 0
			for range 5 {
				calls++
				resp, err := e.Check(t, context.Background(), req("etcd-drill", key, ""))
				if err != nil {
					errs++
					firstErr = err
					continue
				}
				if resp.GetRule() != id {
					wrongRule++
				}
				if resp.GetAllowed() {
					allowed++
				}
			}
			if allowed > 3 {
				overs++
			}
			calls++
			resp, err := e.Check(t, context.Background(), req("drill", "etcd-good-"+e.ID, ""))
			if err != nil {
				errs++
				firstErr = err
			} else if !resp.GetAllowed() {
				goodRefused++
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	for _, e := range s.Enforcers() {
		code, body, err := e.Get(context.Background(), "/readyz")
		if err != nil || code != http.StatusOK {
			t.Errorf("%s /readyz with etcd down: %d %q %v; want 200 (degraded): an etcd outage must not pull enforcers out of rotation", e.ID, code, body, err)
		}
		degraded[e.ID] = strings.TrimSpace(body)
	}
	t.Logf("etcd down %v: %d checks on %d enforcers, %d errors, %d not decided by the etcd rule, %d keys over its burst, %d good checks refused; /readyz e.g. %q",
		time.Since(down).Round(time.Millisecond), calls, len(s.Enforcers()), errs, wrongRule, overs, goodRefused, degraded[s.Enforcers()[0].ID])
	if errs > 0 {
		t.Errorf("%d checks failed with etcd down (first: %v)", errs, firstErr)
	}
	if wrongRule > 0 || overs > 0 {
		t.Errorf("with etcd down, %d answers were not decided by the last rules and %d keys got more than the rule allows", wrongRule, overs)
	}
	if goodRefused > 0 {
		t.Errorf("%d good checks refused with etcd down", goodRefused)
	}

	var starts []func(testing.TB)
	for _, m := range s.Etcd.Members {
		starts = append(starts, func(tb testing.TB) { m.Start(tb) })
	}
	stack.Parallel(t, starts...)
	back := time.Now()
	t.Logf("etcd back (healthy) %v after the stop", back.Sub(down).Round(time.Millisecond))

	id2 := id + "-after"
	ctx, cancel = context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := putRetry(ctx, etcd, "/allot/rules/"+id2, `{"match":{"plan":"etcd-back"},"limits":[{"name":"second","rate":1000,"per":"1s"}]}`); err != nil {
		t.Fatalf("etcd put after the restart: %v", err)
	}
	got := waitRule(t, s, back, "etcd-back", "etcd-back-probe", id2, 30*time.Second)
	who, worst := maxOf(got)
	t.Logf("recovery: a rule written after etcd returned enforced everywhere %v after etcd was healthy (slowest %s); per enforcer: %s", worst.Round(time.Millisecond), who, byRegion(s, got))
	for _, e := range s.Enforcers() {
		e.WaitPeers(t, 2, 30*time.Second)
	}
	for _, k := range []string{id, id2} {
		if _, err := etcd.Delete(ctx, "/allot/rules/"+k); err != nil {
			t.Errorf("etcd delete %s: %v", k, err)
		}
	}
}

// putRetry writes key until etcd accepts it or ctx ends (the client reconnects after the
// outage on its own schedule).
func putRetry(ctx context.Context, etcd *clientv3.Client, key, val string) error {
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := etcd.Put(pctx, key, val)
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
