package app

import (
	"bytes"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// Reports are authenticated by default (issue 27 §1): without the certificate files the
// enforcer does not start and says which command makes them; balancer.insecure, the
// explicit opt-out, starts with a warning.
func TestReportsAuthenticatedByDefault(t *testing.T) {
	cfg := twoRegions(t)
	cfg.Balancer.Enabled, cfg.Balancer.Addrs = true, []string{"127.0.0.1:1"} // never reached: no Run
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "balancer.insecure") {
		t.Fatalf("balancer.enabled without TLS: %v, want an error naming balancer.tls and balancer.insecure", err)
	}
	dir := t.TempDir()
	cfg.Balancer.TLS = TLSConfig{Enabled: true, CAFile: filepath.Join(dir, "ca.pem"),
		CertFile: filepath.Join(dir, "enforcer-us-east.pem"), KeyFile: filepath.Join(dir, "enforcer-us-east-key.pem")}
	if a, err := New(cfg, nil); err == nil || !strings.Contains(err.Error(), "balancer certs -dir") {
		if a != nil {
			a.Close()
		}
		t.Fatalf("certificates not made: %v, want an error naming `balancer certs`", err)
	}
	cfg.Balancer.TLS, cfg.Balancer.Insecure = TLSConfig{}, true
	var mu sync.Mutex
	var logs bytes.Buffer
	a, err := New(cfg, hclog.New(&hclog.LoggerOptions{Output: syncWriter{&mu, &logs}}))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "[WARN]  USAGE REPORTS ARE NOT AUTHENTICATED") {
		t.Fatalf("balancer.insecure logged %q, want a warning", logs.String())
	}
}

type syncWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (s syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
