package balancer

import (
	"context"
	"math"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/allot-dev/allot/pkg/testenv/poll"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// loopEnforcer stands in for an enforcer: it polls the share set in etcd (head, then
// every chunk; a set is taken only when every chunk carries the head's rev and version,
// as pkg/contract says) and reports usage over gRPC with the set it applies.
type loopEnforcer struct {
	region, id string
	mu         sync.Mutex // mu guards rev, ver, set
	rev        int64
	ver        uint64
	set        map[key][]float64
}

func (e *loopEnforcer) poll(ctx context.Context, cli *clientv3.Client, prefix string, regions []string) {
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return
	}
	var head contract.Head
	chunks := map[int]contract.Chunk{}
	for _, kv := range resp.Kvs {
		if string(kv.Key) == contract.HeadKey(prefix) {
			head, _ = contract.DecodeHead(kv.Value)
		} else if i, ok := contract.ChunkIndex(prefix, string(kv.Key)); ok {
			if c, err := contract.DecodeChunk(kv.Value); err == nil {
				chunks[i] = c
			}
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !contract.Newer(head.LeaderRev, head.Version, e.rev, e.ver) {
		return
	}
	set := map[key][]float64{}
	for i := range head.Chunks {
		c, ok := chunks[i]
		if !ok || c.LeaderRev != head.LeaderRev || c.Version != head.Version {
			return // a version being written: wait for the next head
		}
		for _, en := range c.Entries {
			s := make([]float64, len(regions))
			for r, name := range regions {
				s[r] = en.Shares[name]
			}
			set[key{en.Rule, en.Identity}] = s
		}
	}
	e.rev, e.ver, e.set = head.LeaderRev, head.Version, set
}

func (e *loopEnforcer) share(k key, r int) float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s, ok := e.set[k]; ok {
		return s[r]
	}
	return 1.0 / 3
}

func (e *loopEnforcer) applied() (int64, uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.rev, e.ver
}

// TestEtcdSharesFollowTrafficThroughEtcd closes the loop through real etcd and gRPC: a
// leading replica, two enforcers per region watching the published sets and reporting the
// version they apply, and a key whose traffic moves from us-east to ap-south. Its shares
// follow, and at no observed instant do the shares applied across regions sum above 1.
func TestEtcdSharesFollowTrafficThroughEtcd(t *testing.T) {
	e := testenv.Etcd(t, 3)
	prefix := "/loop/"
	cfg := DefaultServiceConfig()
	cfg.Core = testConfig()
	interval := 2 * time.Second
	cfg.Core.Interval, cfg.Core.Learning, cfg.Core.EarlyGap = interval, interval, time.Second
	cfg.Core.SilentAfter, cfg.Core.AckTimeout = 3*interval, time.Second
	cfg.Etcd, cfg.Advertise = client(t, e.Endpoints()...), "leader:1"
	cfg.ElectionPrefix, cfg.SharesPrefix = prefix+"election", prefix+"shares/"
	cfg.SessionTTL, cfg.TickEvery = testSessionTTL, 100*time.Millisecond
	s, err := NewService(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	poll.True(t, 10*time.Second, "leading", func() bool { ok, _ := s.Leading(); return ok })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	allotv1.RegisterBalancerServer(srv, s)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = srv.Serve(lis) }()
	defer func() { srv.Stop(); wg.Wait() }()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	bc := allotv1.NewBalancerClient(cc)

	k := key{"default", "key:hot"}
	var enfs []*loopEnforcer
	for _, region := range regions3 {
		for _, id := range []string{"a", "b"} {
			enfs = append(enfs, &loopEnforcer{region: region, id: region + "-" + id})
		}
	}
	var (
		mu       sync.Mutex // guards hot, worst
		hot      = 0
		worst    float64
		violated string
	)
	appliedSum := func() float64 {
		sum := 0.0
		for r, region := range regions3 {
			m := 0.0
			for _, en := range enfs {
				if en.region == region {
					m = max(m, en.share(k, r))
				}
			}
			sum += m
		}
		return sum
	}
	ctx, cancel := context.WithCancel(context.Background())
	var ewg sync.WaitGroup
	watchCli := client(t, e.Endpoints()...)
	for i, en := range enfs {
		ewg.Add(1)
		go func() {
			defer ewg.Done()
			seq := uint64(0)
			nextReport := time.Now().Add(time.Duration(i) * 150 * time.Millisecond)
			last := time.Now()
			for ctx.Err() == nil {
				en.poll(ctx, watchCli, cfg.SharesPrefix, regions3)
				if sum := appliedSum(); sum > 1+1e-9 {
					mu.Lock()
					violated = time.Now().Format(time.StampMilli)
					mu.Unlock()
				} else {
					mu.Lock()
					worst = max(worst, sum)
					mu.Unlock()
				}
				if now := time.Now(); now.After(nextReport) {
					seq++
					mu.Lock()
					h := hot
					mu.Unlock()
					rate := 0.0
					if en.region == regions3[h] {
						rate = 95 // of a limit of 100: the share follows demand, the slack goes by the default split
					}
					rev, ver := en.applied()
					rq := &allotv1.ReportRequest{Region: en.region, EnforcerId: en.id, Seq: seq,
						IntervalStartMs: last.UnixMilli(), IntervalEndMs: now.UnixMilli(), ShareLeaderRev: rev, ShareVersion: ver,
						Usage: []*allotv1.IdentityUsage{{Rule: k.rule, Identity: k.identity, Admitted: rate * now.Sub(last).Seconds()}}}
					rctx, rcancel := context.WithTimeout(ctx, time.Second)
					_, _ = bc.Report(rctx, rq)
					rcancel()
					last, nextReport = now, now.Add(interval)
				}
				select {
				case <-ctx.Done():
				case <-time.After(50 * time.Millisecond):
				}
			}
		}()
	}
	defer func() { cancel(); ewg.Wait() }()
	regionShare := func(r int) float64 { // the least share any enforcer of r applies
		m := math.Inf(1)
		for _, en := range enfs {
			if en.region == regions3[r] {
				m = min(m, en.share(k, r))
			}
		}
		return m
	}
	poll.True(t, 20*time.Second, "us-east applying ≥ 0.9", func() bool { return regionShare(0) >= 0.9 })
	mu.Lock()
	hot = 2
	mu.Unlock()
	// Reports carry the shift at most one interval later; two intervals of recompute; the
	// decrease's acknowledgement, which these stand-in enforcers send with their next
	// regular report (≤ one interval; report.Reporter sends it within AckGap of applying);
	// and the watch.
	took := poll.True(t, 4*interval+2*time.Second, "ap-south applying ≥ 0.5", func() bool { return regionShare(2) >= 0.5 })
	t.Logf("ap-south applies ≥ 0.5 %v after the shift (interval %v)", took.Round(time.Millisecond), interval)
	poll.True(t, 4*interval, "ap-south applying ≥ 0.9", func() bool { return regionShare(2) >= 0.9 })
	mu.Lock()
	defer mu.Unlock()
	if violated != "" {
		t.Fatalf("at %s the applied shares summed above 1", violated)
	}
	t.Logf("largest applied sum observed %.6f", worst)
}
