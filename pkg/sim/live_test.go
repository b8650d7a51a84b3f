package sim

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/enforcer/grpcapi"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/allot-dev/allot/pkg/sim/scenario"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
)

// serveRegion starts one enforcer of region on loopback with the scenario's rules at
// share 1/2, and returns its address.
func serveRegion(t *testing.T, sc *scenario.Scenario, region string) string {
	t.Helper()
	var y bytes.Buffer
	if err := RulesYAML(&y, sc); err != nil {
		t.Fatal(err)
	}
	set, err := rules.ParseYAML(y.Bytes())
	if err != nil {
		t.Fatalf("RulesYAML does not parse: %v\n%s", err, y.String())
	}
	snap, err := rules.Compile(set, rules.CompileOptions{Region: region, Regions: map[string]float64{"us-east": 1, "eu-west": 1}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := enforcer.DefaultConfig()
	cfg.Region = region
	cfg.Rules = rules.NewHolder(snap)
	cfg.Store = bucket.NewMemory(clock.Real(), 0)
	cfg.Registerer = prometheus.NewRegistry()
	e, err := enforcer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	grpcapi.New(e, grpcapi.Config{}).Register(g)
	go g.Serve(lis)
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

func TestRunLive(t *testing.T) {
	if testing.Short() {
		t.Skip("real time: 4 s")
	}
	sc, err := scenario.Parse([]byte(`name: live
duration: 4s
seed: 3
regions:
  us-east: {enforcers: 1}
  eu-west: {enforcers: 1}
keys:
  - name: k
    limit: {rate: 100, per: 1s, burst: 100}
    phases:
      - {at: 0s, offered: {us-east: 150, eu-west: 20}}
`), "live.yaml")
	if err != nil {
		t.Fatal(err)
	}
	targets, err := ParseTargets("us-east=" + serveRegion(t, sc, "us-east") + ",eu-west=" + serveRegion(t, sc, "eu-west"))
	if err != nil {
		t.Fatal(err)
	}
	var progress bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := RunLive(ctx, sc, LiveOptions{Targets: targets, Progress: &progress, Concurrency: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("progress:\n%s", progress.String())
	if n := strings.Count(progress.String(), "\n"); n != 4 {
		t.Fatalf("want one progress line per second, got %d", n)
	}
	k := res.Summary.Keys[0]
	// us-east enforces half of 100/s (burst 50) and is offered 150/s: about 50 + 4 × 50
	// admitted there, plus eu-west's 20/s under its 50/s.
	us, eu := int64(0), int64(0)
	for s := 0; s < res.Seconds; s++ {
		us += res.Cell(0, s, 0).Admitted
		eu += res.Cell(0, s, 1).Admitted
	}
	if us < 200 || us > 270 || k.Offered < 500 || eu < 40 || eu > 120 {
		t.Fatalf("admitted us-east %d eu-west %d of %d offered: %+v", us, eu, k.Offered, k)
	}
	if sh := res.Cell(0, 2, 0).Share; sh != 0.5 {
		t.Fatalf("share from the answers' quota: %g, want 0.5", sh)
	}
}

func TestParseTargets(t *testing.T) {
	m, err := ParseTargets("us-east=a:1|b:2,eu-west=c:3")
	if err != nil || len(m["us-east"]) != 2 || m["eu-west"][0] != "c:3" {
		t.Fatalf("%v %v", m, err)
	}
	for _, bad := range []string{"us-east", "=a:1", "us-east=", "us-east=a:1|"} {
		if _, err := ParseTargets(bad); err == nil {
			t.Errorf("ParseTargets(%q) accepted", bad)
		}
	}
}
