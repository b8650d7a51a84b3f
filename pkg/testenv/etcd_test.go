package testenv

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// TestEtcdSingle checks that the v3.7 client works against the image's etcd for KV,
// Watch, Lease and concurrency.Election.
func TestEtcdSingle(t *testing.T) {
	t.Parallel()
	e := Etcd(t, 1)
	if eps := e.Endpoints(); len(eps) != 1 || !strings.HasPrefix(eps[0], "http://127.0.0.1:") {
		t.Fatalf("Endpoints() = %v", eps)
	}
	cli := e.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	st, err := cli.Status(ctx, e.Endpoints()[0])
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	t.Logf("etcd server version %s", st.Version)

	// KV and Watch.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wch := cli.Watch(wctx, "/allot-test/k")
	if _, err := cli.Put(ctx, "/allot-test/k", "v1"); err != nil {
		t.Fatalf("Put: %v", err)
	}
	if resp, err := cli.Get(ctx, "/allot-test/k"); err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v1" {
		t.Fatalf("Get = %v, %v; want v1", resp, err)
	}
	select {
	case wr := <-wch:
		if err := wr.Err(); err != nil || len(wr.Events) != 1 || string(wr.Events[0].Kv.Value) != "v1" {
			t.Fatalf("watch response %+v, %v; want one event with v1", wr.Events, err)
		}
	case <-ctx.Done():
		t.Fatal("no watch event")
	}
	wcancel()

	// Lease: grant, attach, keep alive once, TTL, revoke deletes the key.
	lease, err := cli.Grant(ctx, 10)
	if err != nil {
		t.Fatalf("Grant: %v", err)
	}
	if _, err := cli.Put(ctx, "/allot-test/leased", "x", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatalf("Put with lease: %v", err)
	}
	if _, err := cli.KeepAliveOnce(ctx, lease.ID); err != nil {
		t.Fatalf("KeepAliveOnce: %v", err)
	}
	if ttl, err := cli.TimeToLive(ctx, lease.ID, clientv3.WithAttachedKeys()); err != nil || ttl.TTL <= 0 || len(ttl.Keys) != 1 {
		t.Fatalf("TimeToLive = %+v, %v; want a live lease with one key", ttl, err)
	}
	if _, err := cli.Revoke(ctx, lease.ID); err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	if resp, err := cli.Get(ctx, "/allot-test/leased"); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("Get after Revoke = %v, %v; want no key", resp, err)
	}

	// Election: a leader, a follower that takes over when the leader resigns.
	s1, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	defer s1.Close()
	s2, err := concurrency.NewSession(cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatalf("NewSession: %v", err)
	}
	defer s2.Close()
	e1 := concurrency.NewElection(s1, "/allot-test/election")
	e2 := concurrency.NewElection(s2, "/allot-test/election")
	if err := e1.Campaign(ctx, "one"); err != nil {
		t.Fatalf("Campaign one: %v", err)
	}
	won := make(chan error, 1)
	go func() { won <- e2.Campaign(ctx, "two") }()
	if l, err := e1.Leader(ctx); err != nil || string(l.Kvs[0].Value) != "one" {
		t.Fatalf("Leader = %v, %v; want one", l, err)
	}
	if err := e1.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	if err := <-won; err != nil {
		t.Fatalf("Campaign two: %v", err)
	}
	if l, err := e2.Leader(ctx); err != nil || string(l.Kvs[0].Value) != "two" {
		t.Fatalf("Leader after Resign = %v, %v; want two", l, err)
	}
	octx, ocancel := context.WithCancel(ctx)
	obs := e2.Observe(octx)
	select {
	case l := <-obs:
		if len(l.Kvs) != 1 || string(l.Kvs[0].Value) != "two" {
			t.Errorf("Observe gave %v, want two", l.Kvs)
		}
	case <-ctx.Done():
		t.Error("Observe gave nothing")
	}
	ocancel()
	for range obs { // Observe's goroutine closes the channel once octx ends
	}
}

// TestEtcdThree stops the leader of a 3-member cluster: the others carry on, and the
// member comes back on its ports with its data.
func TestEtcdThree(t *testing.T) {
	t.Parallel()
	e := Etcd(t, 3)
	cli := e.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "/allot-test/a", "1"); err != nil {
		t.Fatalf("Put: %v", err)
	}
	leader := leaderOf(ctx, t, cli, e)

	began := time.Now()
	leader.Stop(t)
	var err error
	for attempt := 0; attempt < 100; attempt++ { // bounded: each try waits at most 2 s
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = cli.Put(pctx, "/allot-test/b", "2")
		pcancel()
		if err == nil || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("Put with the leader stopped: %v", err)
	}
	t.Logf("etcd: writes succeed %v after stopping the leader", time.Since(began).Round(time.Millisecond))

	began = time.Now()
	leader.Start(t)
	t.Logf("etcd: stopped member healthy again %v after Start", time.Since(began).Round(time.Millisecond))
	one, err := clientv3.New(clientv3.Config{
		Endpoints: []string{leader.ClientURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	resp, err := one.Get(ctx, "/allot-test/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 2 {
		t.Fatalf("Get from the restarted member = %v, %v; want both keys", resp, err)
	}

	// A paused member stops answering; the other two keep the quorum.
	leader.Pause(t)
	pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = one.Get(pctx, "/allot-test/a")
	pcancel()
	if err == nil {
		t.Fatal("Get from a paused member succeeded")
	}
	// A call the balancer sends to the paused member hangs until its deadline: retry.
	began = time.Now()
	for attempt := 0; attempt < 10; attempt++ {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = cli.Put(pctx, "/allot-test/c", "3")
		pcancel()
		if err == nil || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("Put with one member paused: %v", err)
	}
	t.Logf("etcd: Put with one member paused took %v", time.Since(began).Round(time.Millisecond))
	leader.Unpause(t)
	if resp, err := one.Get(ctx, "/allot-test/c"); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("Get from the unpaused member = %v, %v; want the key written meanwhile", resp, err)
	}
}

func leaderOf(ctx context.Context, t *testing.T, cli *clientv3.Client, e *EtcdCluster) *EtcdMember {
	t.Helper()
	for _, m := range e.Members {
		st, err := cli.Status(ctx, m.ClientURL)
		if err != nil {
			t.Fatalf("Status %s: %v", m.ClientURL, err)
		}
		if st.Leader == st.Header.MemberId {
			return m
		}
	}
	t.Fatal("no member is the leader")
	return nil
}
