package registry

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// testLogger routes a registry's logs to t.Log.
func testLogger(t testing.TB, name string) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: name, Level: hclog.Debug, Output: logWriter{t}})
}

type logWriter struct{ t testing.TB }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// unreachableClient is a real etcd client pointed at a closed port: every call waits
// until its deadline, as when etcd is down.
func unreachableClient(t *testing.T) *clientv3.Client {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func TestNewRejects(t *testing.T) {
	if _, err := New(nil, validConfig()); err == nil || !strings.Contains(err.Error(), "client") {
		t.Fatalf("New(nil client) = %v", err)
	}
	c := validConfig()
	c.ID = "a/b"
	if _, err := New(unreachableClient(t), c); err == nil || !strings.Contains(err.Error(), `ID "a/b"`) {
		t.Fatalf("New(bad ID) = %v", err)
	}
}

// TestStartWhileEtcdUnreachable: an enforcer started while etcd is down still counts
// itself, says it is not registered, and closes at once; no goroutine is left.
func TestStartWhileEtcdUnreachable(t *testing.T) {
	r, err := New(unreachableClient(t), validConfig())
	if err != nil {
		t.Fatal(err)
	}
	if r.Peers() != 1 || !errors.Is(r.Healthy(), ErrNotStarted) {
		t.Fatalf("before Start: Peers %d, Healthy %v", r.Peers(), r.Healthy())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Start(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Start(canceled ctx) = %v, want context.Canceled", err)
	}
	if err := r.Start(context.Background()); err == nil {
		t.Fatalf("second Start succeeded")
	}
	if r.Peers() != 1 || !errors.Is(r.Healthy(), ErrNotRegistered) || len(r.Members()) != 0 {
		t.Fatalf("unregistered: Peers %d, Healthy %v, Members %v", r.Peers(), r.Healthy(), r.Members())
	}
	began := time.Now()
	if err := r.Close(); err != nil {
		t.Fatalf("Close with nothing to revoke = %v", err)
	}
	if d := time.Since(began); d > time.Second {
		t.Fatalf("Close took %v while a registration attempt was in flight", d)
	}
	if err := r.Close(); err != nil || !errors.Is(r.Healthy(), ErrClosed) {
		t.Fatalf("second Close = %v, Healthy %v", err, r.Healthy())
	}
	if err := r.Start(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after Close = %v", err)
	}
}

func TestCloseWithoutStart(t *testing.T) {
	r, err := New(unreachableClient(t), validConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkPeers measures the hot-path read: one atomic load, no allocation.
func BenchmarkPeers(b *testing.B) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	r, err := New(cli, validConfig())
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	b.ReportAllocs()
	var sink atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		n := 0
		for pb.Next() {
			n += r.Peers()
		}
		sink.Add(int64(n))
	})
	if sink.Load() < int64(b.N) {
		b.Fatalf("Peers summed to %d over %d calls, want >= 1 each", sink.Load(), b.N)
	}
}
