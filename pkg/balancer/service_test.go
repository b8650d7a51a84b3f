package balancer

import (
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestServiceStartClose: with etcd unreachable a replica still starts and closes at once
// (Close aborts the session being created, not after WriteTimeout); a second Start does
// nothing, every Close waits and returns nil, and Start after Close is ErrClosed.
func TestServiceStartClose(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	newService := func() *Service {
		cfg := DefaultServiceConfig()
		cfg.Core = testConfig()
		cfg.Etcd, cfg.Advertise = cli, "a:7070"
		s, err := NewService(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	s := newService()
	for i := range 2 {
		if err := s.Start(); err != nil {
			t.Fatalf("Start #%d = %v", i+1, err)
		}
	}
	began := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(began); d >= s.cfg.WriteTimeout {
		t.Fatalf("Close took %v with etcd unreachable, want well under WriteTimeout %v", d, s.cfg.WriteTimeout)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	if err := s.Start(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after Close = %v, want ErrClosed", err)
	}

	never := newService()
	if err := never.Close(); err != nil {
		t.Fatal(err)
	}
	if err := never.Start(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after Close without Start = %v, want ErrClosed", err)
	}
}
