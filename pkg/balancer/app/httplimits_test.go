package app

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// serveLimited serves h under l on a loopback listener and returns its address.
func serveLimited(t *testing.T, h http.Handler, l httpLimits) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := newHTTPServer(h, l)
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// closedWithin writes partial to a new connection and reports how long the server took to
// close it (the read ends in EOF or a reset); it fails past limit.
func closedWithin(t *testing.T, addr, partial string, limit time.Duration) time.Duration {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := io.WriteString(c, partial); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(start.Add(limit)) //nolint:errcheck
	_, err = io.Copy(io.Discard, c)     // the server's answer, if any, then its close
	took := time.Since(start)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("connection still open after %v", took)
	}
	return took
}

func TestHTTPServerCutsSlowClients(t *testing.T) {
	l := httpLimits{ReadHeader: 200 * time.Millisecond, Read: 400 * time.Millisecond,
		Write: time.Second, Idle: time.Second, MaxHeaderBytes: 4 << 10}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/read", func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) })
	addr := serveLimited(t, mux, l)
	// The bound is the limit plus slack for a loaded machine, far below what an unbounded
	// server does (it waits for ever).
	const slack = 3 * time.Second
	t.Run("slow headers", func(t *testing.T) {
		closedWithin(t, addr, "GET /healthz HTTP/1.1\r\nHost: x\r\n", l.ReadHeader+slack)
	})
	t.Run("slow body", func(t *testing.T) {
		closedWithin(t, addr, "POST /read HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc", l.Read+slack)
	})
	t.Run("slow body to a handler that does not read it", func(t *testing.T) {
		closedWithin(t, addr, "POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nabc", l.Read+slack)
	})
	t.Run("header too large", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		big := make([]byte, 16<<10)
		for i := range big {
			big[i] = 'a'
		}
		io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: "+string(big)+"\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(slack)) //nolint:errcheck
		buf := make([]byte, 12)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "HTTP/1.1 431" {
			t.Fatalf("got %q, %v; want HTTP/1.1 431", buf, err)
		}
	})
}

func TestDefaultHTTPLimitsAreTheEnforcers(t *testing.T) {
	s := newHTTPServer(http.NotFoundHandler(), defaultHTTPLimits)
	if s.ReadHeaderTimeout != 5*time.Second || s.ReadTimeout != 10*time.Second || s.IdleTimeout != 2*time.Minute ||
		s.WriteTimeout == 0 || s.MaxHeaderBytes != 64<<10 {
		t.Fatalf("balancer HTTP server limits %+v", defaultHTTPLimits)
	}
}
