package report

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/allot-dev/allot/pkg/testenv/poll"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Leader discovery against real etcd: the Reporter reads the campaign value of the
// election's first key, and after that leader resigns and goes away, finds the next one.
func TestEtcdLeaderDiscovery(t *testing.T) {
	e := testenv.Etcd(t, 1)
	cli := e.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	campaign := func(addr string) (*concurrency.Session, *concurrency.Election) {
		t.Helper()
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		el := concurrency.NewElection(s, contract.ElectionPrefix)
		if err := el.Campaign(ctx, addr); err != nil {
			t.Fatal(err)
		}
		return s, el
	}

	first := startBalancer(t, true, "")
	_, el := campaign(first.addr)
	// A key under a neighbouring prefix must not be taken for the leader.
	if _, err := cli.Put(ctx, contract.ElectionPrefix+"-other/x", "127.0.0.1:1"); err != nil {
		t.Fatal(err)
	}
	if got, err := EtcdLeader(cli, "").Leader(ctx); err != nil || got != first.addr {
		t.Fatalf("Leader = %q, %v; want %q", got, err, first.addr)
	}

	g := newRig(t, EtcdLeader(cli, contract.ElectionPrefix), func(c *ReporterConfig) { c.SendTimeout = time.Second })
	g.tick(t, 10*time.Second)
	poll.True(t, 10*time.Second, "a report at the elected leader", func() bool { return len(first.reports()) == 1 })

	// The leader resigns and stops; a new one is elected. The next report fails at the
	// cached address, re-reads the election, and its retry (same seq) lands at the new one.
	if err := el.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	first.srv.Stop()
	second := startBalancer(t, true, "")
	campaign(second.addr)
	g.tick(t, 10*time.Second)
	poll.True(t, 10*time.Second, "a report at the new leader", func() bool { return len(second.reports()) == 1 })
	if got, want := second.reports()[0].Seq, first.reports()[0].Seq+1; got != want {
		t.Fatalf("seq %d at the new leader, want %d", got, want)
	}
	poll.True(t, 10*time.Second, "the sent counter", func() bool { return counter(t, g, "allot_usage_reports_sent_total") == 2 })
	if f := counter(t, g, "allot_usage_report_failures_total"); f != 1 {
		t.Fatalf("failures %v, want 1 (the old leader's address)", f)
	}

	// No leader at all: the lookup says so.
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	defer ccancel()
	if _, err := EtcdLeader(cli, "/allot/nobody").Leader(cctx); err == nil {
		t.Fatal("a leader under an empty prefix")
	}
}
