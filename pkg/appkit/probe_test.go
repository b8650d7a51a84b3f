package appkit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestProbe(t *testing.T) {
	var notReady atomic.Bool
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		if notReady.Load() {
			http.Error(w, "app: closed\nmore", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready, degraded: etcd: unreachable")
	})
	srv := httptest.NewServer(h)
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// The address as configured: an unspecified host is asked on loopback.
	for _, listen := range []string{srv.Listener.Addr().String(), ":" + port, "0.0.0.0:" + port} {
		got, err := Probe(ctx, listen, "/readyz", false)
		if err != nil || got != "ready, degraded: etcd: unreachable" {
			t.Errorf("Probe(%q) = %q, %v", listen, got, err)
		}
	}
	notReady.Store(true)
	_, err := Probe(ctx, ":"+port, "/readyz", false)
	if err == nil || !strings.Contains(err.Error(), "503") || !strings.Contains(err.Error(), "app: closed") ||
		strings.Contains(err.Error(), "more") || !strings.Contains(err.Error(), "127.0.0.1:"+port+"/readyz") {
		t.Errorf("not ready: %v; want the URL, the status and the first line", err)
	}
	if _, err := Probe(ctx, ":"+port, "/nope", false); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("wrong path: %v", err)
	}

	tlsSrv := httptest.NewTLSServer(h)
	defer tlsSrv.Close()
	notReady.Store(false)
	if got, err := Probe(ctx, tlsSrv.Listener.Addr().String(), "/readyz", true); err != nil || !strings.HasPrefix(got, "ready") {
		t.Errorf("over TLS: %q, %v", got, err)
	}
	if _, err := Probe(ctx, tlsSrv.Listener.Addr().String(), "/readyz", false); err == nil {
		t.Error("plain HTTP to a TLS listener: no error")
	}

	if _, err := Probe(ctx, "", "/readyz", false); !errors.Is(err, ErrNoHTTP) {
		t.Errorf("no listener: %v, want ErrNoHTTP", err)
	}
	if _, err := Probe(ctx, "8080", "/readyz", false); err == nil || !strings.Contains(err.Error(), `"8080"`) {
		t.Errorf("bad address: %v, want it named", err)
	}
	closed := httptest.NewServer(h)
	addr := closed.Listener.Addr().String()
	closed.Close()
	if _, err := Probe(ctx, addr, "/readyz", false); err == nil {
		t.Errorf("nothing listening on %s: no error", addr)
	}
}
