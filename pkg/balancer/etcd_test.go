package balancer

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/allot-dev/allot/pkg/testenv/poll"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The tests below run against a real 3-member etcd cluster (pkg/testenv) and skip under
// -short.

const testSessionTTL = 2 * time.Second

type logWriter struct{ t testing.TB }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func client(t *testing.T, endpoints ...string) *clientv3.Client {
	t.Helper()
	cl, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second,
		DialKeepAliveTime: 10 * time.Second, DialKeepAliveTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

type replica struct {
	s   *Service
	reg *prometheus.Registry
	cli *clientv3.Client
}

func newReplica(t *testing.T, cli *clientv3.Client, prefix, name string, hook func(*Publication)) *replica {
	t.Helper()
	cfg := DefaultServiceConfig()
	cfg.Core = testConfig()
	cfg.Core.Interval, cfg.Core.Learning, cfg.Core.EarlyGap = time.Second, time.Second, time.Second
	cfg.Core.SilentAfter, cfg.Core.AckTimeout = 5*time.Second, time.Second
	cfg.Etcd, cfg.Advertise = cli, name+":7070"
	cfg.ElectionPrefix, cfg.SharesPrefix = prefix+"election", prefix+"shares/"
	cfg.SessionTTL, cfg.TickEvery, cfg.WriteTimeout = testSessionTTL, 200*time.Millisecond, 3*time.Second
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: name, Level: hclog.Info, Output: logWriter{t}})
	s, err := NewService(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.beforeWrite = hook
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return &replica{s: s, reg: reg, cli: cli}
}

func (r *replica) leading() bool { ok, _ := r.s.Leading(); return ok }

func readHead(t *testing.T, cli *clientv3.Client, prefix string) (contract.Head, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, contract.HeadKey(prefix+"shares/"))
	if err != nil || len(resp.Kvs) == 0 {
		return contract.Head{}, false
	}
	h, err := contract.DecodeHead(resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return h, true
}

// feed sends one report per region to s, all traffic of key:hot in us-east.
func feed(t *testing.T, s *Service, seq uint64) {
	t.Helper()
	now := time.Now()
	for _, region := range regions3 {
		rate := 0.0
		if region == "us-east" {
			rate = 900
		}
		_, err := s.Report(context.Background(), report(region, "e-"+region, seq, now, use("key:hot", rate, 0)))
		if err != nil {
			t.Fatal(err)
		}
	}
}

func leaderOf(a, b *replica) (*replica, *replica) {
	if a.leading() {
		return a, b
	}
	return b, a
}

func TestEtcdElectionFencingAndRedirect(t *testing.T) {
	e := testenv.Etcd(t, 3)
	t.Run("failover continues the persisted version", func(t *testing.T) {
		prefix := "/t1/"
		a := newReplica(t, client(t, e.Endpoints()...), prefix, "a", nil)
		b := newReplica(t, client(t, e.Endpoints()...), prefix, "b", nil)
		poll.True(t, 10*time.Second, "a leader", func() bool { return a.leading() || b.leading() })
		time.Sleep(100 * time.Millisecond)
		if a.leading() && b.leading() {
			t.Fatal("two leaders")
		}
		lead, standby := leaderOf(a, b)
		_, rev1 := lead.s.Leading()
		// Reports until the hot key's shares are published.
		var head1 contract.Head
		seq := uint64(0)
		poll.True(t, 15*time.Second, "the hot key published", func() bool {
			seq++
			feed(t, lead.s, seq)
			h, ok := readHead(t, lead.cli, prefix)
			head1 = h
			return ok && h.LeaderRev == rev1 && h.Entries == 1
		})
		// Kill the leader without resigning: its client goes, its lease expires.
		_ = lead.cli.Close()
		took := poll.True(t, testSessionTTL+5*time.Second, "the standby to lead", standby.leading)
		t.Logf("standby leads %v after the leader's client closed (session TTL %v)", took.Round(time.Millisecond), testSessionTTL)
		_, rev2 := standby.s.Leading()
		var head2 contract.Head
		poll.True(t, 5*time.Second, "the new leader's head", func() bool {
			h, ok := readHead(t, standby.cli, prefix)
			head2 = h
			return ok && h.LeaderRev == rev2
		})
		if rev2 <= rev1 || head2.Version <= head1.Version || head2.Entries != 1 {
			t.Fatalf("new term rev %d version %d entries %d; old rev %d version %d: want a higher rev, a later version, the entry kept",
				rev2, head2.Version, head2.Entries, rev1, head1.Version)
		}
	})

	t.Run("standby redirects over gRPC", func(t *testing.T) {
		prefix := "/t2/"
		a := newReplica(t, client(t, e.Endpoints()...), prefix, "a", nil)
		poll.True(t, 10*time.Second, "a leads", a.leading)
		b := newReplica(t, client(t, e.Endpoints()...), prefix, "b", nil)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer()
		allotv1.RegisterBalancerServer(srv, b.s)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); _ = srv.Serve(lis) }()
		defer func() { srv.Stop(); wg.Wait() }()
		cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := allotv1.NewBalancerClient(cc).Report(ctx, report("us-east", "e1", 1, time.Now(), use("key:a", 1, 0)))
		if err != nil {
			t.Fatal(err)
		}
		_, rev := a.s.Leading()
		if resp.Accepted || resp.LeaderAddr != "a:7070" || resp.LeaderRev != rev {
			t.Fatalf("standby answered %+v, want a redirect to a:7070 (rev %d)", resp, rev)
		}
		if got := testutil.ToFloat64(b.s.m.reports.WithLabelValues("us-east", "redirected")); got != 1 {
			t.Fatalf("redirected reports %g, want 1", got)
		}
		// A closed standby leaves the election at once (its lease is revoked).
		_ = b.s.Close()
		gctx, gcancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer gcancel()
		keys, err := a.cli.Get(gctx, prefix+"election/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil || keys.Count != 1 {
			t.Fatalf("election keys after the standby closed: %v (%v), want 1", keys, err)
		}
	})

	t.Run("a deposed leader's late write is refused by etcd", func(t *testing.T) {
		prefix := "/t3/"
		var (
			mu      sync.Mutex
			armed   bool
			blocked = make(chan struct{})
			release = make(chan struct{})
		)
		hook := func(*Publication) {
			mu.Lock()
			stop := armed
			armed = false
			mu.Unlock()
			if stop {
				close(blocked)
				<-release
			}
		}
		// a talks to member 0 only, b to the other two.
		a := newReplica(t, client(t, e.Members[0].ClientURL), prefix, "a", hook)
		poll.True(t, 10*time.Second, "a leads", a.leading)
		b := newReplica(t, client(t, e.Members[1].ClientURL, e.Members[2].ClientURL), prefix, "b", nil)
		_, revA := a.s.Leading()
		poll.True(t, 5*time.Second, "a's head", func() bool { h, ok := readHead(t, b.cli, prefix); return ok && h.LeaderRev == revA })
		mu.Lock()
		armed = true
		mu.Unlock()
		<-blocked // a is about to write; freeze it and its etcd member
		// However the test ends, a's hook must return: Close (a cleanup) waits for a's loop.
		var releaseOnce sync.Once
		letGo := func() { releaseOnce.Do(func() { close(release) }) }
		defer letGo()
		e.Members[0].Pause(t)
		paused := true
		defer func() {
			if paused {
				e.Members[0].Unpause(t)
			}
		}()
		took := poll.True(t, testSessionTTL+10*time.Second, "b to lead once a's lease expired", b.leading)
		// b's first write may time out (WriteTimeout 3 s) while the two members left settle
		// without member 0, and is retried a TickEvery later; on a loaded machine b's first
		// terms may also end (its session lost while the two elect a raft leader) and b
		// campaigns again: the head to wait for is that of b's term now, not its first.
		var revB int64
		poll.True(t, 15*time.Second, "b's head", func() bool {
			h, ok := readHead(t, b.cli, prefix)
			_, revB = b.s.Leading()
			return ok && revB > 0 && h.LeaderRev == revB
		})
		t.Logf("b leads %v after a froze", took.Round(time.Millisecond))
		e.Members[0].Unpause(t)
		paused = false
		letGo() // a's late write goes to etcd now
		fenced := func() float64 {
			return testutil.ToFloat64(a.s.m.writes.WithLabelValues("head", "fenced")) + testutil.ToFloat64(a.s.m.writes.WithLabelValues("chunk", "fenced"))
		}
		poll.True(t, 10*time.Second, "a's late write refused", func() bool { return fenced() >= 1 })
		poll.True(t, 5*time.Second, "a steps down", func() bool { return !a.leading() })
		if h, _ := readHead(t, b.cli, prefix); h.LeaderRev != revB {
			t.Fatalf("head rev %d after a's late write, want b's %d", h.LeaderRev, revB)
		}
		if !b.leading() {
			t.Fatal("b no longer leads")
		}
		t.Logf("a's fenced writes: %g", fenced())
	})
}
