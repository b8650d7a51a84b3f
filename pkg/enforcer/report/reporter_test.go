package report

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/testenv/poll"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// fakeBalancer is an allot.v1.Balancer on loopback: a leader that records what it is sent
// (optionally failing the next calls), or a standby that redirects to redirect.
type fakeBalancer struct {
	allotv1.UnimplementedBalancerServer
	addr string
	srv  *grpc.Server

	mu       sync.Mutex // mu guards the fields below
	leader   bool
	redirect string
	failNext int
	others   int64 // answered as every quota's others' count
	got      []*allotv1.ReportRequest
	parents  []string // each call's traceparent ("" without)
}

func startBalancer(t *testing.T, leader bool, redirect string) *fakeBalancer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &fakeBalancer{addr: lis.Addr().String(), srv: grpc.NewServer(), leader: leader, redirect: redirect}
	allotv1.RegisterBalancerServer(b.srv, b)
	done := make(chan struct{})
	go func() { defer close(done); _ = b.srv.Serve(lis) }()
	t.Cleanup(func() { b.srv.Stop(); <-done })
	return b
}

func (b *fakeBalancer) Report(ctx context.Context, r *allotv1.ReportRequest) (*allotv1.ReportResponse, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.got = append(b.got, r)
	tp := ""
	if v := metadata.ValueFromIncomingContext(ctx, "traceparent"); len(v) > 0 {
		tp = v[0]
	}
	b.parents = append(b.parents, tp)
	if b.failNext > 0 {
		b.failNext--
		return nil, status.Error(codes.Unavailable, "fake: failing once")
	}
	if !b.leader {
		return &allotv1.ReportResponse{LeaderAddr: b.redirect}, nil
	}
	resp := &allotv1.ReportResponse{Accepted: true, LeaderRev: 7, QuotaAnswered: len(r.Quotas) > 0, QuotaIsolatedFraction: 0.5}
	for _, q := range r.Quotas {
		resp.QuotaOthers = append(resp.QuotaOthers, &allotv1.QuotaCount{Rule: q.Rule, Limit: q.Limit, Identity: q.Identity,
			PeriodStartMs: q.PeriodStartMs, Quota: q.Quota, Count: b.others})
	}
	return resp, nil
}

func (b *fakeBalancer) reports() []*allotv1.ReportRequest {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]*allotv1.ReportRequest(nil), b.got...)
}

type rig struct {
	clk *clock.Fake
	tb  *Table
	rep *Reporter
	reg *prometheus.Registry
}

func newRig(t *testing.T, leader LeaderSource, mod func(*ReporterConfig)) *rig {
	t.Helper()
	g := &rig{clk: clock.NewFake(t0), reg: prometheus.NewRegistry()}
	g.tb = newTable(t, nil)
	cfg := DefaultReporterConfig()
	cfg.Table, cfg.Region, cfg.EnforcerID, cfg.Leader = g.tb, "us-east", "e1", leader
	cfg.Clock, cfg.Registerer = g.clk, g.reg
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Output: testWriter{t}, Level: hclog.Debug})
	cfg.Shares = func() (int64, uint64) { return 42, 9 }
	if mod != nil {
		mod(&cfg)
	}
	rep, err := NewReporter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g.rep = rep
	t.Cleanup(func() { _ = rep.Close() })
	return g
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// tick waits until the Reporter has parked on its timer, then advances the fake clock.
func (g *rig) tick(t *testing.T, d time.Duration) {
	t.Helper()
	poll.True(t, 10*time.Second, "the reporter to park on the clock", func() bool { return g.clk.Timers() == 1 })
	g.clk.Advance(d)
}

func counter(t *testing.T, g *rig, name string) float64 {
	t.Helper()
	mfs, err := g.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func TestReporterValidate(t *testing.T) {
	tb := newTable(t, nil)
	good := DefaultReporterConfig()
	good.Table, good.Region, good.EnforcerID, good.Leader, good.Registerer = tb, "r", "e", StaticLeader("x:1"), prometheus.NewRegistry()
	for name, mod := range map[string]func(*ReporterConfig){
		"Table":        func(c *ReporterConfig) { c.Table = nil },
		"Region":       func(c *ReporterConfig) { c.Region = "" },
		"EnforcerID":   func(c *ReporterConfig) { c.EnforcerID = "" },
		"Leader":       func(c *ReporterConfig) { c.Leader = nil },
		"Registerer":   func(c *ReporterConfig) { c.Registerer = nil },
		"SendTimeout":  func(c *ReporterConfig) { c.SendTimeout = 0 },
		"MaxRedirects": func(c *ReporterConfig) { c.MaxRedirects = -1 },
	} {
		c := good
		mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: err = %v, want one naming the field", name, err)
		}
	}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
}

// A standby redirects to the leader; the report arrives there filled in, and the next
// one goes straight to the leader it learned.
func TestReporterFollowsRedirect(t *testing.T) {
	lead := startBalancer(t, true, "")
	standby := startBalancer(t, false, lead.addr)
	g := newRig(t, StaticLeader(standby.addr), nil)
	a := rule("default", 10)
	g.tb.ObserveTake(a, "key:k1", 30, true, false, 0, t0)
	g.tb.ObserveTake(a, "key:k1", 4, false, false, 0, t0)

	g.tick(t, 10*time.Second)
	poll.True(t, 10*time.Second, "a report at the leader", func() bool { return len(lead.reports()) == 1 })
	r := lead.reports()[0]
	if r.Region != "us-east" || r.EnforcerId != "e1" || r.ShareLeaderRev != 42 || r.ShareVersion != 9 || r.Early {
		t.Fatalf("report header %v", r)
	}
	if r.Seq != uint64(t0.UnixMilli())+1 || r.IntervalStartMs != t0.UnixMilli() || r.IntervalEndMs != t0.Add(10*time.Second).UnixMilli() {
		t.Fatalf("seq %d interval [%d, %d)", r.Seq, r.IntervalStartMs, r.IntervalEndMs)
	}
	if len(r.Usage) != 1 || r.Usage[0].Admitted != 30 || r.Usage[0].Refused != 4 {
		t.Fatalf("usage %v", r.Usage)
	}
	if n := len(standby.reports()); n != 1 {
		t.Fatalf("standby saw %d reports, want 1", n)
	}

	g.tick(t, 10*time.Second)
	poll.True(t, 10*time.Second, "a second report at the leader", func() bool { return len(lead.reports()) == 2 })
	if r2 := lead.reports()[1]; r2.Seq != r.Seq+1 || r2.IntervalStartMs != r.IntervalEndMs {
		t.Fatalf("second report seq %d start %d, want %d and %d", r2.Seq, r2.IntervalStartMs, r.Seq+1, r.IntervalEndMs)
	}
	if n := len(standby.reports()); n != 1 {
		t.Fatalf("standby asked again (%d reports): the leader should be cached", n)
	}
	poll.True(t, 10*time.Second, "the sent counter", func() bool { return counter(t, g, "allot_usage_reports_sent_total") == 2 })
	if v := counter(t, g, "allot_usage_report_redirects_total"); v != 1 {
		t.Fatalf("redirects %v, want 1", v)
	}
}

// DialOptions reach the connection: an interceptor given there sees every Report call.
func TestReporterDialOptions(t *testing.T) {
	lead := startBalancer(t, true, "")
	var mu sync.Mutex
	var methods []string
	seen := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		mu.Lock()
		methods = append(methods, method)
		mu.Unlock()
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	g := newRig(t, StaticLeader(lead.addr), func(c *ReporterConfig) { c.DialOptions = []grpc.DialOption{seen} })
	g.tick(t, 10*time.Second)
	poll.True(t, 10*time.Second, "a report at the leader", func() bool { return len(lead.reports()) == 1 })
	mu.Lock()
	defer mu.Unlock()
	if len(methods) != 1 || methods[0] != allotv1.Balancer_Report_FullMethodName {
		t.Fatalf("the interceptor saw %v, want one %s", methods, allotv1.Balancer_Report_FullMethodName)
	}
}

// Standbys pointing at each other: the attempt gives up after MaxRedirects, the retry
// too, and the report is dropped.
func TestReporterRedirectsBounded(t *testing.T) {
	a := startBalancer(t, false, "")
	b := startBalancer(t, false, a.addr)
	a.mu.Lock()
	a.redirect = b.addr
	a.mu.Unlock()
	g := newRig(t, StaticLeader(a.addr), func(c *ReporterConfig) { c.MaxRedirects = 2 })
	g.tick(t, 10*time.Second)
	poll.True(t, 10*time.Second, "the drop", func() bool { return counter(t, g, "allot_usage_reports_dropped_total") == 1 })
	// Two attempts × (1 + 2 redirects) calls.
	if n := len(a.reports()) + len(b.reports()); n != 6 {
		t.Fatalf("%d calls, want 6", n)
	}
}

// A leader that fails once gets the same seq again, and counts it once.
func TestReporterRetriesOnceWithSameSeq(t *testing.T) {
	lead := startBalancer(t, true, "")
	lead.failNext = 1
	g := newRig(t, StaticLeader(lead.addr), nil)
	g.tb.ObserveTake(rule("default", 10), "key:k1", 1, true, false, 0, t0)
	g.tick(t, 10*time.Second)
	poll.True(t, 10*time.Second, "the retry", func() bool { return len(lead.reports()) == 2 })
	got := lead.reports()
	if got[0].Seq != got[1].Seq || len(got[1].Usage) != 1 {
		t.Fatalf("retry seq %d after %d, usage %v", got[1].Seq, got[0].Seq, got[1].Usage)
	}
	poll.True(t, 10*time.Second, "the sent counter", func() bool { return counter(t, g, "allot_usage_reports_sent_total") == 1 })
	if f, d := counter(t, g, "allot_usage_report_failures_total"), counter(t, g, "allot_usage_reports_dropped_total"); f != 1 || d != 0 {
		t.Fatalf("failures %v dropped %v, want 1 and 0", f, d)
	}
}

// A leader that is down: each report is tried twice and dropped, nothing piles up, the
// next seq moves on, and the check path neither allocates nor waits.
func TestReporterLeaderDownDrops(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	_ = lis.Close() // nothing listens there now: connection refused
	src := &movingLeader{addr: dead}
	// The Fences hook runs at every report, sent or not: a cut-off enforcer marks itself
	// fenced in its region's store even when no report leaves. It is told each report's
	// seq, one more at each (a mark names the one before: every report up to it was sent).
	var fences atomic.Int32
	var lastSeq, badSeq atomic.Uint64
	g := newRig(t, src, func(c *ReporterConfig) {
		c.SendTimeout = 500 * time.Millisecond
		c.Fences = func(_ context.Context, _ time.Time, seq uint64) Fenced {
			if last := lastSeq.Swap(seq); last != 0 && seq != last+1 {
				badSeq.Store(seq)
			}
			fences.Add(1)
			return Fenced{Seen: 2}
		}
	})
	a := rule("default", 10)
	for i := 1; i <= 3; i++ {
		for j := 0; j < 1000; j++ {
			g.tb.ObserveTake(a, "key:k"+string(rune('a'+j%26)), 1, true, false, 0, t0)
		}
		g.tick(t, 10*time.Second)
		want := float64(i)
		poll.True(t, 10*time.Second, "a drop", func() bool { return counter(t, g, "allot_usage_reports_dropped_total") == want })
	}
	if f := counter(t, g, "allot_usage_report_failures_total"); f != 6 {
		t.Fatalf("failures %v, want 2 per report", f)
	}
	// While the Reporter is failing, observes stay allocation-free and the table bounded.
	g.tb.ObserveTake(a, "key:x", 1, true, false, 0, t0)
	if n := testing.AllocsPerRun(200, func() { g.tb.ObserveTake(a, "key:x", 1, true, false, 0, t0) }); n != 0 {
		t.Fatalf("%v allocs per observe while the leader is down", n)
	}
	if g.tb.Len() > g.tb.cfg.Capacity {
		t.Fatalf("table Len %d above capacity", g.tb.Len())
	}
	// A leader is elected again: the next report carries the next seq (dropped ones are
	// not resent) and covers only its own interval.
	lead := startBalancer(t, true, "")
	src.set(lead.addr)
	g.tick(t, 10*time.Second)
	poll.True(t, 10*time.Second, "a report at the new leader", func() bool { return len(lead.reports()) == 1 })
	r := lead.reports()[0]
	if r.Seq != uint64(t0.UnixMilli())+4 || r.IntervalStartMs != t0.Add(30*time.Second).UnixMilli() {
		t.Fatalf("seq %d start %d", r.Seq, r.IntervalStartMs)
	}
	if r.FencedSeen != 2 || fences.Load() != 4 {
		t.Fatalf("fenced_seen %d after %d Fences calls, want 2 after 4 (one a report)", r.FencedSeen, fences.Load())
	}
	if b := badSeq.Load(); b != 0 || lastSeq.Load() != r.Seq {
		t.Fatalf("Fences told seq %d out of turn, last %d; want each report's, the last %d", b, lastSeq.Load(), r.Seq)
	}
}

// movingLeader is a LeaderSource whose answer the test changes.
type movingLeader struct {
	mu   sync.Mutex // mu guards addr
	addr string
}

func (m *movingLeader) set(addr string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.addr = addr
}

func (m *movingLeader) Leader(context.Context) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.addr, nil
}

// A jump in refusals sends an early report once EarlyGap has passed, well before the
// interval ends.
func TestReporterEarly(t *testing.T) {
	lead := startBalancer(t, true, "")
	g := newRig(t, StaticLeader(lead.addr), nil)
	poll.True(t, 10*time.Second, "the reporter to park", func() bool { return g.clk.Timers() == 1 })
	g.clk.Advance(500 * time.Millisecond)
	g.tb.ObserveTake(rule("default", 10), "key:k1", 500, false, false, 0, t0) // a jump, 0.5 s in
	// The Reporter wakes (Early channel), finds the gap (1 s) not passed, and parks until
	// t0+1s: wait for that timer (the one it had before also counts as one timer).
	poll.True(t, 10*time.Second, "the reporter to park until t0+1s", func() bool { return g.clk.Waiting(t0.Add(time.Second)) })
	g.clk.Advance(500 * time.Millisecond)
	poll.True(t, 10*time.Second, "an early report", func() bool { return len(lead.reports()) == 1 })
	r := lead.reports()[0]
	if !r.Early || r.IntervalEndMs != t0.Add(time.Second).UnixMilli() || len(r.Usage) != 1 {
		t.Fatalf("early %v end %d usage %v", r.Early, r.IntervalEndMs-t0.UnixMilli(), r.Usage)
	}
	// The regular schedule does not move for the early report: the next regular report
	// is at t0+10s, as it would have been (every enforcer keeps its phase).
	poll.True(t, 10*time.Second, "the reporter to park until t0+10s", func() bool { return g.clk.Waiting(t0.Add(10 * time.Second)) })
	g.clk.Advance(9 * time.Second)
	poll.True(t, 10*time.Second, "the regular report", func() bool { return len(lead.reports()) == 2 })
	if r2 := lead.reports()[1]; r2.Early || r2.IntervalEndMs != t0.Add(10*time.Second).UnixMilli() {
		t.Fatalf("second report early %v end %d", r2.Early, r2.IntervalEndMs-t0.UnixMilli())
	}
	poll.True(t, 10*time.Second, "counters", func() bool { return counter(t, g, "allot_usage_reports_sent_total") == 2 })
	if v := counter(t, g, "allot_usage_reports_early_total"); v != 1 {
		t.Fatalf("early counter %v", v)
	}
}

// Close while a send hangs returns promptly (the RPC is cancelled) and is idempotent.
func TestReporterCloseAbortsSend(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	block := make(chan struct{})
	allotv1.RegisterBalancerServer(srv, blocking{c: block})
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	defer func() { close(block); srv.Stop(); <-done }()

	g := newRig(t, StaticLeader(lis.Addr().String()), func(c *ReporterConfig) { c.SendTimeout = time.Minute })
	g.tick(t, 10*time.Second)
	began := time.Now()
	if err := g.rep.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(began); d > 5*time.Second {
		t.Fatalf("Close took %v", d)
	}
	_ = g.rep.Close()
	if v := testutil.ToFloat64(g.rep.m.sent); v != 0 {
		t.Fatalf("sent %v", v)
	}
}

type blocking struct {
	allotv1.UnimplementedBalancerServer
	c chan struct{}
}

func (b blocking) Report(ctx context.Context, _ *allotv1.ReportRequest) (*allotv1.ReportResponse, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-b.c:
		return &allotv1.ReportResponse{Accepted: true}, nil
	}
}

// A new share set applied brings the next report forward to AckGap after the last one,
// so the balancer sees the version acknowledged without waiting out the interval.
func TestReporterAcknowledgesNewSharesEarly(t *testing.T) {
	lead := startBalancer(t, true, "")
	changed := make(chan struct{}, 1)
	g := newRig(t, StaticLeader(lead.addr), func(c *ReporterConfig) {
		c.SharesChanged, c.AckGap = changed, 500*time.Millisecond
	})
	poll.True(t, 10*time.Second, "the reporter to park", func() bool { return g.clk.Timers() == 1 })
	g.clk.Advance(100 * time.Millisecond)
	changed <- struct{}{} // a set swapped in 100 ms after the interval began
	// The Reporter wakes, finds AckGap not passed, and parks until t0+500ms.
	poll.True(t, 10*time.Second, "the reporter to park until t0+500ms", func() bool { return g.clk.Waiting(t0.Add(500 * time.Millisecond)) })
	g.clk.Advance(400 * time.Millisecond)
	poll.True(t, 10*time.Second, "the acknowledging report", func() bool { return len(lead.reports()) == 1 })
	if r := lead.reports()[0]; !r.Ack || r.Early || r.IntervalEndMs != t0.Add(500*time.Millisecond).UnixMilli() || r.ShareVersion != 9 {
		t.Fatalf("ack %v early %v end %dms version %d, want an acknowledgement (not early: no refusals jumped) at 500ms carrying version 9",
			r.Ack, r.Early, r.IntervalEndMs-t0.UnixMilli(), r.ShareVersion)
	}
	// Without another change the regular schedule follows, from that report.
	g.tick(t, 10*time.Second)
	poll.True(t, 10*time.Second, "the regular report", func() bool { return len(lead.reports()) == 2 })
	if r2 := lead.reports()[1]; r2.Early || r2.Ack {
		t.Fatal("the regular report is marked early or ack")
	}
}

// Leave sends one last report, flagged final, with what was counted since the last one,
// and stops like Close; a second Leave or Close sends nothing more.
func TestReporterLeaveSendsFinalReport(t *testing.T) {
	lead := startBalancer(t, true, "")
	g := newRig(t, StaticLeader(lead.addr), nil)
	g.tb.ObserveTake(rule("default", 10), "key:k1", 3, true, false, 0, t0)
	if err := g.rep.Leave(); err != nil {
		t.Fatal(err)
	}
	got := lead.reports()
	if len(got) != 1 || !got[0].Final || len(got[0].Usage) != 1 || got[0].Usage[0].Admitted != 3 || got[0].ShareVersion != 9 {
		t.Fatalf("reports %v, want one final report with key:k1's 3 tokens and share version 9", got)
	}
	_ = g.rep.Leave()
	_ = g.rep.Close()
	if n := len(lead.reports()); n != 1 {
		t.Fatalf("%d reports after a second Leave and Close, want 1", n)
	}
}
