package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/allot-dev/allot/pkg/contract"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/e2e/stack"
	"github.com/allot-dev/allot/pkg/balancer/admin"
	"github.com/allot-dev/allot/pkg/certs"
	"github.com/allot-dev/allot/pkg/testenv"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// adminToken is the stack's one admin token in TestBalancerDrills (named "drill").
const adminToken = "drill-admin-secret-0123456789abcdef"

// adminClient is an admin API client of the current leader (any replica serves the admin
// API; the leader is the one sure to be running), as `balancer rules ...` is.
func adminClient(t *testing.T, s *stack.Stack, token string) *admin.Client {
	return &admin.Client{Base: s.Leader(t, 15*time.Second).HTTP, Token: token}
}

// putRule is `PUT /v1/admin/rules/{id}` compared on revision (read first when 0).
func putRule(ctx context.Context, c *admin.Client, id, rule, reason string) (admin.Result, error) {
	var res admin.Result
	l, err := c.Rules(ctx)
	if err != nil {
		return res, err
	}
	req := admin.RuleRequest{Revision: l.Revision, Reason: reason, Rule: json.RawMessage(rule)}
	return res, c.Do(ctx, http.MethodPut, "/v1/admin/rules/"+id, nil, 0, req, &res)
}

// adminKeys reads every key the admin API writes (rules, audit records, the change key)
// with its mod revision: what "nothing was written" compares.
func adminKeys(t *testing.T, cli *clientv3.Client) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, p := range []string{contract.RulesPrefix, contract.AuditPrefix, contract.ChangeKey} {
		resp, err := cli.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatalf("etcd get %s: %v", p, err)
		}
		for _, kv := range resp.Kvs {
			out[string(kv.Key)] = kv.ModRevision
		}
	}
	return out
}

func sameKeys(a, b map[string]int64) string {
	var diff []string
	for k, v := range a {
		if w, ok := b[k]; !ok {
			diff = append(diff, "-"+k)
		} else if w != v {
			diff = append(diff, "~"+k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			diff = append(diff, "+"+k)
		}
	}
	return strings.Join(diff, " ")
}

// drillAdminRuleChange: P5 through the admin API. A rule put with
// `PUT /v1/admin/rules/{id}` (what `balancer rules apply` sends for a file) must be
// enforced by every enforcer of every region within 10 s (the goal is under 1 s); two
// regions read etcd over 80 ms / 140 ms round trips. Then deleted the same way.
func drillAdminRuleChange(t *testing.T, s *stack.Stack) {
	c := adminClient(t, s, adminToken)
	id := fmt.Sprintf("drill-admin-%d", time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	rule := fmt.Sprintf(`{"id":%q,"match":{"plan":"admin-p5"},"limits":[{"name":"second","rate":1000,"per":"1s"}]}`, id)
	put := time.Now()
	res, err := putRule(ctx, c, id, rule, "drill: P5 through the admin API")
	if err != nil {
		t.Fatalf("admin PUT rule: %v", err)
	}
	acked := time.Since(put)
	got := waitRule(t, s, put, "admin-p5", "admin-p5-key", id, 10*time.Second)
	who, worst := maxOf(got)
	t.Logf("P5 (admin API): rule %s acknowledged %v after the call (revision %d, audit %s), enforced everywhere %v after it (slowest %s); per enforcer: %s",
		id, acked.Round(time.Millisecond), res.Revision, res.Audit, worst.Round(time.Millisecond), who, byRegion(s, got))
	if worst > 10*time.Second {
		t.Errorf("P5: propagation through the admin API %v, promise 10 s", worst)
	}
	if len(res.Changed) != 1 || res.Changed[0] != id || res.Audit == "" {
		t.Errorf("admin PUT answered %+v, want the rule changed and an audit record", res)
	}
	if _, err := c.Delete(ctx, "rules", id, "drill: clean up", 0); err != nil {
		t.Errorf("admin DELETE rule: %v", err)
	}
}

// drillAdminAuth: admin calls without a token, with a wrong one or with a malformed
// header are refused with 401 and write nothing to etcd.
func drillAdminAuth(t *testing.T, s *stack.Stack) {
	etcd := s.Etcd.Client(t)
	before := adminKeys(t, etcd)
	id := fmt.Sprintf("drill-noauth-%d", time.Now().UnixNano())
	rule := fmt.Sprintf(`{"id":%q,"match":{"plan":"noauth"},"limits":[{"name":"second","rate":1,"per":"1s"}]}`, id)
	base := s.Leader(t, 15*time.Second).HTTP
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	calls := 0
	for _, tok := range []struct{ name, header string }{
		{"no token", ""},
		{"wrong token", "Bearer drill-admin-secret-0123456789abcdeX"},
		{"the right secret, not as a bearer token", adminToken},
		{"basic auth", "Basic ZHJpbGw6" + adminToken},
	} {
		for _, call := range []struct{ method, path, body string }{
			{http.MethodGet, "/v1/admin/rules", ""},
			{http.MethodPut, "/v1/admin/rules/" + id, fmt.Sprintf(`{"revision":1,"reason":"x","rule":%s}`, rule)},
			{http.MethodPut, "/v1/admin/rules", `{"revision":1,"reason":"x","yaml":"rules: []"}`},
			{http.MethodDelete, "/v1/admin/rules/drill?reason=x", ""},
		} {
			calls++
			req, _ := http.NewRequestWithContext(ctx, call.method, "http://"+base+call.path, strings.NewReader(call.body))
			if tok.header != "" {
				req.Header.Set("Authorization", tok.header)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("%s %s (%s): %v", call.method, call.path, tok.name, err)
			}
			var body admin.ErrorResponse
			_ = json.NewDecoder(resp.Body).Decode(&body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized || body.Error == "" || resp.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("%s %s with %s: %d %q (WWW-Authenticate %q), want 401 with a message and the header",
					call.method, call.path, tok.name, resp.StatusCode, body.Error, resp.Header.Get("WWW-Authenticate"))
			}
			if calls == 1 {
				t.Logf("unauthenticated: %d %q", resp.StatusCode, body.Error)
			}
		}
	}
	if _, err := adminClient(t, s, "drill-admin-secret-wrong-0123456789").Rules(ctx); !isStatus(err, http.StatusUnauthorized) {
		t.Errorf("the admin client with a wrong token: %v, want 401", err)
	}
	after := adminKeys(t, etcd)
	if d := sameKeys(before, after); d != "" {
		t.Errorf("refused admin calls changed etcd: %s", d)
	}
	t.Logf("%d refused admin calls (no token, wrong token, bare secret, basic auth; GET, PUT rule, PUT file, DELETE), all 401; %d admin keys in etcd unchanged", calls+1, len(after))
}

func isStatus(err error, code int) bool {
	var e *admin.APIError
	return errors.As(err, &e) && e.Status == code
}

// drillAdminEtcdDown: with every etcd member stopped, an admin edit fails with a clear
// error (an answer, not a hang) and, once etcd is back, nothing of it is there.
func drillAdminEtcdDown(t *testing.T, s *stack.Stack) {
	etcd := s.Etcd.Client(t)
	before := adminKeys(t, etcd)
	c := adminClient(t, s, adminToken)
	var stops []func(testing.TB)
	for _, m := range s.Etcd.Members {
		stops = append(stops, func(tb testing.TB) { m.Stop(tb) })
	}
	stack.Parallel(t, stops...)
	down := time.Now()

	id := fmt.Sprintf("drill-admin-down-%d", time.Now().UnixNano())
	rule := fmt.Sprintf(`{"id":%q,"match":{"plan":"admin-down"},"limits":[{"name":"second","rate":5,"per":"1s"}]}`, id)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	start := time.Now()
	// The file's revision is the newest read before the stop (a read fails too); a
	// whole file of two rules, so a partial write would show as one of them.
	file := fmt.Sprintf("rules:\n  - id: %s\n    match: {plan: admin-down}\n    limits: [{name: second, rate: 5, per: 1s}]\n  - id: %s-b\n    match: {plan: admin-down-b}\n    limits: [{name: second, rate: 5, per: 1s}]\n", id, id)
	errFile := c.Do(ctx, http.MethodPut, "/v1/admin/rules", nil, 0, admin.ApplyRequest{Revision: maxRev(before), Reason: "drill: etcd down", File: "drill.yaml", YAML: file}, nil)
	tookFile := time.Since(start)
	start = time.Now()
	_, errRule := putRule(ctx, c, id, rule, "drill: etcd down")
	tookRule := time.Since(start)
	cancel()
	t.Logf("etcd down: PUT rules (file) answered in %v: %v; PUT rule answered in %v: %v", tookFile.Round(time.Millisecond), errFile, tookRule.Round(time.Millisecond), errRule)
	for _, e := range []struct {
		name string
		err  error
		took time.Duration
	}{{"PUT /v1/admin/rules", errFile, tookFile}, {"PUT /v1/admin/rules/{id}", errRule, tookRule}} {
		var ae *admin.APIError
		switch {
		case !errors.As(e.err, &ae):
			t.Errorf("%s with etcd down: %v, want an error answer from the admin API", e.name, e.err)
		case ae.Status < 500 || !strings.Contains(ae.ErrorResponse.Error, "etcd"):
			t.Errorf("%s with etcd down: %d %q, want a 5xx naming etcd", e.name, ae.Status, ae.ErrorResponse.Error)
		}
		if e.took > 15*time.Second {
			t.Errorf("%s with etcd down took %v to answer", e.name, e.took)
		}
	}

	var starts []func(testing.TB)
	for _, m := range s.Etcd.Members {
		starts = append(starts, func(tb testing.TB) { m.Start(tb) })
	}
	stack.Parallel(t, starts...)
	t.Logf("etcd back (healthy) %v after the stop", time.Since(down).Round(time.Millisecond))
	after := adminKeys(t, etcd)
	if d := sameKeys(before, after); d != "" {
		t.Errorf("admin edits that failed with etcd down left keys behind: %s", d)
	}
	// The admin API works again once etcd is back.
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	for {
		if _, err = adminClient(t, s, adminToken).Rules(ctx); err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Errorf("admin API after etcd returned: %v", err)
	}
}

func maxRev(m map[string]int64) int64 {
	var r int64
	for _, v := range m {
		r = max(r, v)
	}
	return r
}

// drillReportUnknownRegion: reports are authenticated (issue 27 §1): a plaintext
// report is refused, and one for eu-west over us-east's certificate is PermissionDenied
// and counted as forbidden. A usage report from a region the balancer does not know, with
// a certificate the stack's CA issued for it (allot.v1.Balancer/Report on the leader), is
// InvalidArgument with a message naming it; the leader keeps leading and keeps accepting
// the real enforcers' reports.
func drillReportUnknownRegion(t *testing.T, s *stack.Stack) {
	leader := s.Leader(t, 15*time.Second)
	if _, err := certs.Generate(s.Certs.Dir, certs.Options{Regions: []string{"mars-1"}, Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	client := func(creds credentials.TransportCredentials) allotv1.BalancerClient {
		conn, err := grpc.NewClient(leader.GRPC, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return allotv1.NewBalancerClient(conn)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m0, err := leader.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	probe := func(region string) *allotv1.ReportRequest {
		return &allotv1.ReportRequest{
			Region: region, EnforcerId: "drill-probe", Seq: 1,
			IntervalStartMs: now.Add(-2 * time.Second).UnixMilli(), IntervalEndMs: now.UnixMilli(),
			Usage: []*allotv1.IdentityUsage{{Rule: "drill", Identity: "key:probe", Admitted: 10, RegionalRate: 5}},
		}
	}
	first, second := s.Regions[0].Name, s.Regions[len(s.Regions)-1].Name
	if _, err := client(insecure.NewCredentials()).Report(ctx, probe(first)); err == nil {
		t.Errorf("a plaintext report for %s was accepted", first)
	}
	_, err = client(credentials.NewTLS(testenv.EnforcerTLS(t, s.Certs, first))).Report(ctx, probe(second))
	t.Logf("report for %s over %s's certificate: %v", second, first, err)
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("a report for %s over %s's certificate: %v, want PermissionDenied", second, first, err)
	}
	if m, err := leader.Metrics(ctx); err != nil || m.Labels("allot_balancer_reports_total", "region", `result="forbidden"`)[second] < 1 {
		t.Errorf("the forbidden report is not counted (%v)", err)
	}
	_, err = client(credentials.NewTLS(testenv.EnforcerTLS(t, s.Certs, "mars-1"))).Report(ctx, probe("mars-1"))
	st, _ := status.FromError(err)
	t.Logf("report from region mars-1: %v %q", st.Code(), st.Message())
	if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "mars-1") {
		t.Errorf("report from an unknown region: %v, want InvalidArgument naming the region", err)
	}
	// Keeps working: the same replica leads and accepts every region's reports after.
	accepted := func(m stack.Metrics) map[string]float64 {
		return m.Labels("allot_balancer_reports_total", "region", `result="accepted"`)
	}
	a0 := accepted(m0)
	deadline := time.Now().Add(10 * time.Second)
	var a1 map[string]float64
	for {
		time.Sleep(500 * time.Millisecond)
		m1, err := leader.Metrics(ctx)
		if err == nil {
			a1 = accepted(m1)
			ok := m1.Sum("allot_balancer_leader") == 1
			for _, r := range s.Regions {
				ok = ok && a1[r.Name] > a0[r.Name]
			}
			if ok {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Errorf("after the bad report the leader did not accept reports of every region within 10 s (accepted before %v, after %v)", a0, a1)
			break
		}
	}
	t.Logf("after the bad report: %s still leads; accepted reports by region before %v, after %v", leader.ID, a0, a1)
}
