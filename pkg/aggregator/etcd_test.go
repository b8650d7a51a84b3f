package aggregator

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/enforcer/report"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/allot-dev/allot/pkg/testenv/poll"
)

// The region's aggregators elect one in etcd: it merges; the other answers
// accepted=false with its address, as a standby balancer does; the enforcers find it on
// the region's election; when it closes (resigning) the other takes over at once.
func TestElectionOneServesOtherRedirects(t *testing.T) {
	e := testenv.Etcd(t, 1)
	cli := e.Client(t)
	_, addr := startUpstream(t)
	start := func(adv string) *Aggregator {
		t.Helper()
		cfg := DefaultConfig()
		cfg.Region, cfg.ID, cfg.Advertise = "us-east", "agg-"+adv, adv
		cfg.Upstream, cfg.Etcd, cfg.SessionTTL = report.StaticLeader(addr), cli, 5*time.Second
		cfg.Clock = clock.Real()
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
	first := start("127.0.0.1:7001")
	poll.True(t, 10*time.Second, "the first aggregator elected", first.Elected)
	second := start("127.0.0.1:7002")
	ctx := context.Background()
	resp, err := second.Report(ctx, enfReport("e1", 1, 0, time.Now()))
	if err != nil || resp.Accepted || resp.LeaderAddr != "127.0.0.1:7001" {
		t.Fatalf("the standby answered %v, %v; want accepted=false and the elected one's address", resp, err)
	}
	if got, err := report.EtcdLeader(cli, contract.AggregatorElection("", "us-east")).Leader(ctx); err != nil || got != "127.0.0.1:7001" {
		t.Fatalf("an enforcer resolves %q, %v; want the elected aggregator", got, err)
	}
	began := time.Now()
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	poll.True(t, 10*time.Second, "the second aggregator elected", second.Elected)
	t.Logf("the standby aggregator took over %v after the elected one closed", time.Since(began).Round(time.Millisecond))
	if resp, err := second.Report(ctx, enfReport("e1", 1, 0, time.Now())); err != nil || !resp.Accepted {
		t.Fatalf("the new elected aggregator answered %v, %v; want accepted", resp, err)
	}
}
