package dashboard

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/balancer"
	"github.com/allot-dev/allot/pkg/clock"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

var regions = []string{"us-east", "eu-west", "ap-south"}

var t0 = time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)

// Identities a client chose to be hostile: they must render as text.
const (
	evilScript = `<script>document.title='pwned'</script>`
	evilImg    = `"><img src=x onerror="document.title='pwned2'">`
)

// fakeSource is a replica: a core while leading, nil and a leader address while not.
type fakeSource struct {
	mu     sync.Mutex // mu guards core
	core   *balancer.Core
	leader string
	term   int64
	dash   string // the leader's dashboard URL ("" unknown)
}

func (f *fakeSource) Core() *balancer.Core {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.core
}

func (f *fakeSource) Leader(context.Context) (string, int64) { return f.leader, f.term }

func (f *fakeSource) LeaderDashboard(context.Context) string { return f.dash }

func (f *fakeSource) setCore(c *balancer.Core) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.core = c
}

// demandAt is an identity's demand (tokens/s) per region at virtual time t.
type demandAt func(t time.Duration) [3]float64

type scenario struct {
	rule, identity string
	demand         demandAt
}

// scenarios: a hot key almost all in us-east; one whose traffic moves from eu-west to
// ap-south half way; one spread evenly and over its limit; two hostile names; and a tail
// of small keys.
func scenarios(run time.Duration) []scenario {
	s := []scenario{
		{"pro", "key:k_acme", func(time.Duration) [3]float64 { return [3]float64{430, 25, 15} }},
		{"default", "key:k_globex", func(t time.Duration) [3]float64 {
			if t < run/2 {
				return [3]float64{5, 80, 5}
			}
			return [3]float64{5, 5, 80}
		}},
		{"default", "key:k_initech", func(time.Duration) [3]float64 { return [3]float64{40, 40, 40} }}, // over its limit
		{"default", evilScript, func(time.Duration) [3]float64 { return [3]float64{2, 30, 2} }},
		{"default", evilImg, func(time.Duration) [3]float64 { return [3]float64{25, 1, 1} }},
		// busy for the first third, then gone: no longer reported, forgotten after key_ttl
		{"default", "key:k_gone", func(t time.Duration) [3]float64 {
			if t < run/3 {
				return [3]float64{50, 10, 0}
			}
			return [3]float64{}
		}},
	}
	for i := range 30 {
		s = append(s, scenario{"default", fmt.Sprintf("key:tail-%02d", i), func(time.Duration) [3]float64 {
			return [3]float64{0.5, 0.3, 0.2}
		}})
	}
	return s
}

func limits(rule, _ string) (balancer.Limits, bool) {
	switch rule {
	case "pro":
		return balancer.Limits{Rate: 500, Requests: 1000}, true
	case "default":
		return balancer.Limits{Rate: 100, Requests: 200}, true
	}
	return balancer.Limits{}, false
}

// run is a short virtual run: one enforcer per region reporting every 10 s what it
// admitted (up to its allowance, share × limit) and refused, applying each published set
// at once; the core ticks every second; the dashboard samples every 10 s. It returns the
// dashboard, its source and the clock at the end.
func run(t testing.TB, dur time.Duration, mod func(*Config)) (*Dashboard, *fakeSource, *clock.Fake) {
	t.Helper()
	cc := balancer.DefaultCoreConfig()
	cc.Regions, cc.Limits, cc.LeaderRev = regions, limits, 42
	core, err := balancer.NewCore(cc)
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(t0)
	src := &fakeSource{core: core, leader: "10.0.0.7:9090", term: 42}
	cfg := DefaultConfig()
	cfg.Regions, cfg.Clock = regions, clk
	cfg.Rules = func() []string { return []string{"default", "pro"} }
	// These tests are about what the pages show of identities: shown to everyone here;
	// viewer_test.go is about who sees them.
	cfg.ShowIdentities = true
	if mod != nil {
		mod(&cfg)
	}
	d, err := New(cfg, src)
	if err != nil {
		t.Fatal(err)
	}
	srv := Tap(&coreServer{core: core, clk: clk}, d)
	scs := scenarios(dur)
	var applied uint64
	var seq uint64
	for s := time.Duration(0); s < dur; s += time.Second {
		clk.Set(t0.Add(s))
		now := clk.Now()
		if s%(10*time.Second) == 9*time.Second {
			seq++
			for r, region := range regions {
				req := &allotv1.ReportRequest{Region: region, EnforcerId: region + "-1", Seq: seq,
					IntervalStartMs: now.Add(-10 * time.Second).UnixMilli(), IntervalEndMs: now.UnixMilli(),
					ShareLeaderRev: cc.LeaderRev, ShareVersion: applied}
				for _, sc := range scs {
					want := sc.demand(s)[r] * 10
					if want == 0 {
						continue // an enforcer reports only identities it saw
					}
					allow := math.Inf(1)
					if st, ok := core.Identity(sc.rule, sc.identity); ok {
						allow = st.Published[r] * st.Rate * 10
					} else if lim, ok := limits(sc.rule, sc.identity); ok {
						allow = lim.Rate / 3 * 10
					}
					adm := math.Min(want, allow)
					req.Usage = append(req.Usage, &allotv1.IdentityUsage{Rule: sc.rule, Identity: sc.identity,
						Admitted: adm, Refused: want - adm})
				}
				if _, err := srv.Report(context.Background(), req); err != nil {
					t.Fatal(err)
				}
			}
		}
		if p := core.Tick(now); p != nil {
			core.Published(p, now)
			applied = p.Head.Version
		}
		if s%(10*time.Second) == 0 {
			d.Sample(now)
		}
	}
	return d, src, clk
}

// coreServer is the leader's report API over a bare core (Service.Report without etcd).
type coreServer struct {
	allotv1.UnimplementedBalancerServer
	core *balancer.Core
	clk  clock.Clock
}

func (s *coreServer) Report(_ context.Context, r *allotv1.ReportRequest) (*allotv1.ReportResponse, error) {
	if err := s.core.Ingest(s.clk.Now(), r); err != nil {
		return nil, err
	}
	return &allotv1.ReportResponse{Accepted: true}, nil
}
