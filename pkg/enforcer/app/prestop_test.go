package app

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/clock"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/hashicorp/go-hclog"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestPreStopDelayAnswersChecksWhileNotReady (issue 24 §4): once Run's context ends (the
// signal) and for shutdown.pre_stop_delay on the app's clock, /readyz answers 503 and the
// gRPC health service NOT_SERVING, while /healthz answers and checks are answered over
// gRPC, on a connection opened before and on a new one, and over HTTP on a new
// connection; Run returns only when the delay has passed, and then the drain has closed
// the listeners.
func TestPreStopDelayAnswersChecksWhileNotReady(t *testing.T) {
	const delay = 37 * time.Second
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(path, []byte("rules:\n  - id: roomy\n    limits: [{name: second, rate: 1000, per: 1s}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Region, cfg.Rules.File = "us-east", path
	cfg.Listen.GRPC, cfg.Listen.HTTP = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Shutdown.PreStopDelay = delay
	start := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	fake := clock.NewFake(start)
	a, err := newApp(cfg, hclog.New(&hclog.LoggerOptions{Output: tWriter{t}, Level: hclog.Info}), nil, fake)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- a.Run(ctx) }()
	returned := false
	t.Cleanup(func() {
		cancel()
		fake.Advance(delay)
		a.Close()
		if !returned {
			<-runDone
		}
	})

	plain := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	status := func(path string) int {
		resp, err := plain.Get("http://" + a.HTTPAddr() + path)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	check := func(what string, c allotv1.AllotClient) {
		t.Helper()
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		r, err := c.Check(cctx, &allotv1.CheckRequest{ApiKey: "k"})
		if err != nil || !r.GetAllowed() || r.GetRule() != "roomy" {
			t.Fatalf("%s: %v, %v; want allowed by roomy", what, r, err)
		}
	}
	health := func(c healthpb.HealthClient) healthpb.HealthCheckResponse_ServingStatus {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		r, err := c.Check(cctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatalf("gRPC health: %v", err)
		}
		return r.GetStatus()
	}
	if !poll(5*time.Second, func() bool { return status("/readyz") == http.StatusOK }) {
		t.Fatal("/readyz never 200")
	}
	before := dialT(t, a.GRPCAddr())
	check("before the signal", allotv1.NewAllotClient(before))
	if s := health(healthpb.NewHealthClient(before)); s != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC health before the signal: %v", s)
	}

	cancel() // SIGTERM
	if !poll(5*time.Second, func() bool { return fake.Waiting(start.Add(delay)) }) {
		t.Fatal("no pre-stop timer armed after the signal")
	}
	if c := status("/readyz"); c != http.StatusServiceUnavailable {
		t.Errorf("/readyz during the pre-stop delay: %d, want 503", c)
	}
	if err := a.Ready(); err != ErrStopping {
		t.Errorf("Ready during the pre-stop delay: %v, want ErrStopping", err)
	}
	if c := status("/healthz"); c != http.StatusOK {
		t.Errorf("/healthz during the pre-stop delay: %d, want 200 (alive: no restart)", c)
	}
	if s := health(healthpb.NewHealthClient(before)); s != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health during the pre-stop delay: %v, want NOT_SERVING", s)
	}
	check("on the old connection during the pre-stop delay", allotv1.NewAllotClient(before))
	check("on a new connection during the pre-stop delay", allotv1.NewAllotClient(dialT(t, a.GRPCAddr())))
	resp, err := plain.Post("http://"+a.HTTPAddr()+"/v1/check", "application/json", strings.NewReader(`{"api_key":"k"}`))
	if err != nil {
		t.Fatalf("HTTP check during the pre-stop delay: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("HTTP check during the pre-stop delay: %d, want 200", resp.StatusCode)
	}
	select {
	case err := <-runDone:
		returned = true
		t.Fatalf("Run returned during the pre-stop delay: %v", err)
	default:
	}

	fake.Advance(delay)
	select {
	case err := <-runDone:
		returned = true
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return within 15s of the end of the pre-stop delay")
	}
	if up("http://" + a.HTTPAddr() + "/healthz") {
		t.Fatal("HTTP still accepting after the drain")
	}
}

// TestMaxConnectionAgeGrace: the grace after a connection's age defaults to drain_timeout,
// so the age never cuts a call a shutdown would have let finish.
func TestMaxConnectionAgeGrace(t *testing.T) {
	c := DefaultConfig()
	if c.Listen.MaxConnectionAge != 5*time.Minute || c.Shutdown.PreStopDelay != 0 {
		t.Fatalf("defaults: max_connection_age %v, pre_stop_delay %v; want 5m, 0", c.Listen.MaxConnectionAge, c.Shutdown.PreStopDelay)
	}
	c.DrainTimeout = 25 * time.Second
	if g := c.maxConnectionAgeGrace(); g != 25*time.Second {
		t.Errorf("grace unset: %v, want drain_timeout 25s", g)
	}
	c.Listen.MaxConnectionAgeGrace = time.Minute
	if g := c.maxConnectionAgeGrace(); g != time.Minute {
		t.Errorf("grace set: %v, want 1m", g)
	}
}
