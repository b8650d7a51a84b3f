package appkit

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestRunUntilSignal(t *testing.T) {
	log := hclog.NewNullLogger()
	if code := RunUntilSignal(log, func(context.Context) error { return nil }, nil); code != 0 {
		t.Fatalf("run returned nil: exit %d, want 0", code)
	}
	if code := RunUntilSignal(log, func(context.Context) error { return errors.New("boom") }, nil); code != 1 {
		t.Fatalf("run failed: exit %d, want 1", code)
	}
	// SIGHUP reloads, SIGTERM ends the run's context.
	reloaded := make(chan struct{}, 1)
	code := RunUntilSignal(log, func(ctx context.Context) error {
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			return err
		}
		select {
		case <-reloaded:
		case <-time.After(10 * time.Second):
			return errors.New("SIGHUP did not reload")
		}
		if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(10 * time.Second):
			return errors.New("SIGTERM did not end the context")
		}
	}, func() { reloaded <- struct{}{} })
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
}

// DialEtcd does not wait for a connection: a client to nowhere is made, and closes.
func TestDialEtcd(t *testing.T) {
	cli, err := DialEtcd(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := cli.Close(); err != nil {
		t.Fatal(err)
	}
}
