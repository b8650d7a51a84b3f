package inprocess

import (
	"context"
	"testing"
	"time"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// etcd's embedded server leaves these behind for a moment after Close.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
	)
}

const testRules = `
rules:
  - id: default
    limits: [{name: second, rate: 300, per: 1s}]
`

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

// startStack starts three regions of perRegion enforcers each over rules, at a 1 s
// interval, logging warnings to t, and closes the stack when the test ends.
func startStack(t *testing.T, rules string, perRegion int, mods ...func(*Config)) *Stack {
	t.Helper()
	cfg := Config{
		Regions:  []Region{{"us-east", perRegion}, {"eu-west", perRegion}, {"ap-south", perRegion}},
		Rules:    []byte(rules),
		Interval: time.Second,
		Logger:   hclog.New(&hclog.LoggerOptions{Output: tWriter{t}, Level: hclog.Warn}),
	}
	for _, m := range mods {
		m(&cfg)
	}
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// TestSharesFollowTrafficAcrossRegions: three regions in one process, traffic for one
// key in us-east only. At the default split us-east may admit 100/s of the key's 300/s;
// once the balancer has moved the share, it admits close to the whole limit — and the
// regions' published shares never sum above 1.
func TestSharesFollowTrafficAcrossRegions(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd, a balancer and six enforcers")
	}
	sharesFollowTraffic(t, startStack(t, testRules, 2))
}

// TestSharesFollowTrafficThroughAggregators: the same with a report aggregator per
// region (issue 26 §3): the enforcers report through their region's elected aggregator,
// which forwards one merged report (and every acknowledgement at once) to the leader.
// The share still moves to us-east, the global count never passes the limit, and the
// leader tracks each enforcer behind the aggregators (their acknowledgements), not the
// aggregators.
func TestSharesFollowTrafficThroughAggregators(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd, a balancer, three aggregators and six enforcers")
	}
	s := startStack(t, testRules, 2, func(c *Config) { c.Aggregate = true })
	sharesFollowTraffic(t, s)
	for region, a := range s.Aggregators() {
		if !a.Elected() || a.Members() != 2 {
			t.Errorf("aggregator %s: elected %v, %d members; want elected, 2", region, a.Elected(), a.Members())
		}
	}
	core := s.Leader().Service().Core()
	if core == nil {
		t.Fatal("no leader")
	}
	for _, r := range core.Stats(time.Now()).Regions {
		if r.Enforcers != 2 {
			t.Errorf("the leader tracks %d enforcers in %s, want the 2 behind its aggregator", r.Enforcers, r.Region)
		}
	}
}

func sharesFollowTraffic(t *testing.T, s *Stack) {
	var clients []allotv1.AllotClient
	for _, addr := range s.Targets()["us-east"] {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		clients = append(clients, allotv1.NewAllotClient(cc))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Offer 600 checks a second (twice the global limit) for up to 40 s and watch the
	// admitted rate of each second. Only us-east sees the key, so what it admits is the
	// global count: never more than rate × elapsed + burst (P3, P6).
	var best float64
	total, begin := 0, time.Now()
	deadline := begin.Add(40 * time.Second)
	for sec := 0; time.Now().Before(deadline); sec++ {
		start, admitted := time.Now(), 0
		for i := range 600 {
			d, err := clients[i%len(clients)].Check(ctx, &allotv1.CheckRequest{ApiKey: "k_hot"})
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
			if i%60 == 59 { // pace to ~600/s
				if wait := time.Until(start.Add(time.Duration(i+1) * time.Second / 600)); wait > 0 {
					time.Sleep(wait)
				}
			}
		}
		if wait := time.Until(start.Add(time.Second)); wait > 0 {
			time.Sleep(wait)
		}
		total += admitted
		if bound := 1.01 * (300*time.Since(begin).Seconds() + 300); float64(total) > bound {
			t.Fatalf("after %v: %d admitted globally, over rate × elapsed + burst = %.0f", time.Since(begin), total, bound)
		}
		rate := float64(admitted) / time.Since(start).Seconds()
		t.Logf("second %d: us-east admitted %.0f/s (global limit 300/s, default split 100/s)", sec, rate)
		best = max(best, rate)
		if rate > 250 {
			break
		}
	}
	if best < 250 {
		t.Fatalf("us-east never admitted more than %.0f/s of the key's 300/s: shares did not follow", best)
	}
}
