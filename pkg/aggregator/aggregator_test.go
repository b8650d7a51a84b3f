package aggregator

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/enforcer/report"
	"github.com/allot-dev/allot/pkg/testenv/poll"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// upstream is a fake balancer leader: it records the forwards and answers each with a
// quota answer (the others' count 100 for every quota), or fails while down.
type upstream struct {
	allotv1.UnimplementedBalancerServer
	mu      sync.Mutex
	got     []*allotv1.ReportRequest
	down    bool
	standby string // not "": a standby naming this leader address
	asked   int    // reports received, accepted or not
}

func (u *upstream) Report(_ context.Context, r *allotv1.ReportRequest) (*allotv1.ReportResponse, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.asked++
	if u.down {
		return nil, status.Error(codes.Unavailable, "down")
	}
	if u.standby != "" {
		return &allotv1.ReportResponse{LeaderAddr: u.standby}, nil
	}
	u.got = append(u.got, r)
	resp := &allotv1.ReportResponse{Accepted: true, LeaderRev: 7, QuotaAnswered: true, QuotaIsolatedFraction: 0.3, QuotaHoldAfterMs: 20_000,
		ShareLeaderRev: 7, ShareVersion: uint64(len(u.got))} // a new version each forward
	for _, q := range r.Quotas {
		resp.QuotaOthers = append(resp.QuotaOthers, &allotv1.QuotaCount{Rule: q.Rule, Limit: q.Limit, Identity: q.Identity,
			PeriodStartMs: q.PeriodStartMs, Quota: q.Quota, Count: 100})
	}
	return resp, nil
}

func (u *upstream) forwards() []*allotv1.ReportRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]*allotv1.ReportRequest(nil), u.got...)
}

func (u *upstream) calls() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.asked
}

func (u *upstream) setDown(d bool) {
	u.mu.Lock()
	u.down = d
	u.mu.Unlock()
}

func startUpstream(t *testing.T) (*upstream, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{}
	srv := grpc.NewServer()
	allotv1.RegisterBalancerServer(srv, u)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return u, lis.Addr().String()
}

func newTestAggregator(t *testing.T, clk *clock.Fake, addr string, addrs ...string) *Aggregator {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Region, cfg.ID, cfg.Advertise = "us-east", "agg-1", "127.0.0.1:1"
	cfg.Clock = clk
	if addr != "" {
		cfg.Upstream = report.StaticLeader(addr)
	}
	cfg.Addrs = addrs
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

func enfReport(id string, seq, ver uint64, now time.Time, usage ...*allotv1.IdentityUsage) *allotv1.ReportRequest {
	return &allotv1.ReportRequest{Region: "us-east", EnforcerId: id, Seq: seq, ShareLeaderRev: 7, ShareVersion: ver,
		IntervalStartMs: now.Add(-10 * time.Second).UnixMilli(), IntervalEndMs: now.UnixMilli(), Usage: usage}
}

// TestForwardAckAndHeard: one merged forward per interval listing every enforcer; an
// acknowledgement forwarded at once; an enforcer told it was heard only as of what the
// leader confirmed (never while the leader cannot be reached), and the leader's quota
// answer relayed with its hold time shortened by its age.
func TestForwardAckAndHeard(t *testing.T) {
	up, addr := startUpstream(t)
	clk := clock.NewFake(t0)
	a := newTestAggregator(t, clk, addr)
	ctx := context.Background()
	q := &allotv1.QuotaCount{Rule: "r", Limit: "daily", Identity: "k", PeriodStartMs: 1, Quota: 1000, Count: 10}
	r1 := enfReport("e1", 1, 0, clk.Now(), use("k", 10, 0, 1, 0))
	r1.Quotas = []*allotv1.QuotaCount{q}
	for _, r := range []*allotv1.ReportRequest{r1, enfReport("e2", 1, 0, clk.Now(), use("k", 5, 1, 0, 0))} {
		resp, err := a.Report(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if !resp.Accepted || !resp.Relayed || resp.HeardAgoMs != -1 || resp.QuotaAnswered {
			t.Fatalf("first answer %v: want accepted, relayed, heard_ago_ms -1 (the leader has heard nothing), no quota answer", resp)
		}
	}
	// The interval's forward, once, at Interval.
	poll.True(t, 10*time.Second, "the forward timer", func() bool { return clk.Waiting(t0.Add(10 * time.Second)) })
	clk.Advance(10 * time.Second)
	poll.True(t, 10*time.Second, "the interval's forward", func() bool { return len(up.forwards()) == 1 && !confirmedAt(a, "e2").IsZero() })
	f := up.forwards()[0]
	if f.EnforcerId != "agg-1" || len(f.Members) != 2 || len(f.Usage) != 1 || f.Usage[0].Admitted != 15 || f.Usage[0].Refused != 1 || f.Usage[0].Error != 1 {
		t.Fatalf("forward %v: want agg-1 listing e1 and e2, k admitted 15 refused 1 error 1", f)
	}
	if f.Members[0].HeardAgoMs != 10_000 || f.Members[0].Reports != 1 {
		t.Errorf("member %v: want heard 10 s before the forward, one report", f.Members[0])
	}
	// e2 acknowledges version 3 two seconds later: forwarded at once, not at the interval.
	clk.Advance(2 * time.Second)
	resp, err := a.Report(ctx, enfReport("e2", 2, 3, clk.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if resp.HeardAgoMs != 12_000 || resp.HeardSeq != 1 || resp.ShareLeaderRev != 7 || resp.ShareVersion != 1 {
		t.Errorf("e2 told heard %d ms ago, seq %d, newest set %d/%d; want 12000, seq 1, set 7/1: the leader confirmed its first report in the first forward",
			resp.HeardAgoMs, resp.HeardSeq, resp.ShareLeaderRev, resp.ShareVersion)
	}
	poll.True(t, 10*time.Second, "the acknowledgement's forward", func() bool { return len(up.forwards()) == 2 && confirmedAt(a, "e2").Equal(t0.Add(12*time.Second)) })
	ack := up.forwards()[1]
	if !ack.Ack || ack.Members[1].EnforcerId != "e2" || ack.Members[1].ShareVersion != 3 {
		t.Fatalf("ack forward %v: want ack, e2 at version 3", ack)
	}
	// The quota answer is relayed, its hold shortened by its age.
	clk.Advance(3 * time.Second)
	r := enfReport("e1", 2, 0, clk.Now())
	r.Quotas = []*allotv1.QuotaCount{q}
	resp, err = a.Report(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if !resp.QuotaAnswered || len(resp.QuotaOthers) != 1 || resp.QuotaOthers[0].Count != 100 || resp.QuotaHoldAfterMs != 17_000 || resp.QuotaIsolatedFraction != 0.3 {
		t.Errorf("quota answer %v: want the others' 100, hold 17000 ms (20 s less the answer's 3 s), fraction 0.3", resp)
	}
	if resp.HeardAgoMs != 15_000 {
		t.Errorf("e1 told heard %d ms ago, want 15000 (the forwards confirmed it as of its first report)", resp.HeardAgoMs)
	}
	// The leader unreachable: the next forward fails, and what the enforcers are told they
	// were heard stops moving (they fence themselves as if they could not reach it), and
	// after the leader's hold time they get no quota answer (they hold their region).
	up.setDown(true)
	next := clk.Now().Add(10*time.Second - 3*time.Second)
	poll.True(t, 10*time.Second, "the forward timer", func() bool { return clk.Waiting(next) })
	clk.Set(next)
	clk.Advance(30 * time.Second)
	resp, err = a.Report(ctx, enfReport("e1", 3, 0, clk.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if want := clk.Now().Sub(t0).Milliseconds(); resp.HeardAgoMs != want || resp.QuotaAnswered {
		t.Errorf("with the leader down: heard %d ms ago (want %d, still as of the last confirmed forward), quota answered %v (want false)", resp.HeardAgoMs, want, resp.QuotaAnswered)
	}
}

// TestForwardOverAddrs: with Addrs (the replicas as the region reaches them) the forward
// goes round the list: past an unreachable replica and a standby to the leader, a
// standby's redirect followed only within the list, and the next forward starts at the
// one that accepted.
func TestForwardOverAddrs(t *testing.T) {
	down, downAddr := startUpstream(t)
	down.setDown(true)
	leader, leaderAddr := startUpstream(t)
	standby, standbyAddr := startUpstream(t)
	standby.standby = leaderAddr
	stray, strayAddr := startUpstream(t)
	stray.standby = "127.0.0.1:9" // not one of the list: never dialled
	clk := clock.NewFake(t0)
	a := newTestAggregator(t, clk, "", downAddr, strayAddr, standbyAddr, leaderAddr)
	if _, err := a.Report(context.Background(), enfReport("e1", 1, 0, clk.Now(), use("k", 10, 0, 0, 0))); err != nil {
		t.Fatal(err)
	}
	poll.True(t, 10*time.Second, "the forward timer", func() bool { return clk.Waiting(t0.Add(10 * time.Second)) })
	clk.Advance(10 * time.Second)
	poll.True(t, 10*time.Second, "the forward through the list", func() bool { return len(leader.forwards()) == 1 })
	if down.calls() != 1 || stray.calls() != 1 || standby.calls() != 1 {
		t.Errorf("asked the unreachable one %d times, the stray standby %d, the standby %d; want each once on the way to the leader",
			down.calls(), stray.calls(), standby.calls())
	}
	// The next forward goes to the leader first.
	poll.True(t, 10*time.Second, "the next forward timer", func() bool { return clk.Waiting(t0.Add(20 * time.Second)) })
	clk.Advance(10 * time.Second)
	poll.True(t, 10*time.Second, "the second forward", func() bool { return len(leader.forwards()) == 2 })
	if down.calls() != 1 || stray.calls() != 1 || standby.calls() != 1 {
		t.Errorf("the second forward asked the others again (%d, %d, %d): it must start at the leader", down.calls(), stray.calls(), standby.calls())
	}
}

// confirmedAt is when the leader last confirmed hearing member id (zero: never).
func confirmedAt(a *Aggregator, id string) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	if m := a.merge.members[id]; m != nil {
		return m.confirmed
	}
	return time.Time{}
}

// An invalid report is refused whole (InvalidArgument) with what is wrong.
func TestReportRefusesInvalid(t *testing.T) {
	_, addr := startUpstream(t)
	a := newTestAggregator(t, clock.NewFake(t0), addr)
	r := enfReport("e1", 1, 0, t0)
	r.Region = "eu-west"
	_, err := a.Report(context.Background(), r)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `region "eu-west"`) {
		t.Errorf("a report for another region: %v, want InvalidArgument naming the region", err)
	}
	if a.Members() != 0 {
		t.Errorf("%d members after an invalid report, want 0", a.Members())
	}
}

// Config.Validate names every bad field.
func TestConfigValidate(t *testing.T) {
	c := Config{}
	err := c.Validate()
	for _, want := range []string{"Region", "ID", "Advertise", "Upstream", "Interval", "AckGap", "MaxEntries"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("zero Config: %v, want it to name %s", err, want)
		}
	}
	c = DefaultConfig()
	c.Region, c.ID, c.Advertise = "us-east", "agg-1", "127.0.0.1:1"
	c.Addrs = []string{"127.0.0.1:7000", "nohost"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `Addrs[1]: "nohost" is not host:port`) || strings.Contains(err.Error(), "Upstream") {
		t.Errorf("Addrs without Upstream, one bad: %v; want only Addrs[1] named", err)
	}
}
