package appkit

import (
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
)

// serveLimited serves h under l on a loopback listener and returns its address.
func serveLimited(t *testing.T, h http.Handler, l HTTPLimits) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewHTTPServer(h, l)
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
	l := HTTPLimits{ReadHeader: 200 * time.Millisecond, Read: 400 * time.Millisecond,
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

// TestServersLifecycle: Listen binds both (the addresses are known before Serve), Serve
// serves them, Drain stops them and neither counts as a failure; servers never served
// have their listeners closed by Drain.
func TestServersLifecycle(t *testing.T) {
	s := &Servers{GRPC: grpc.NewServer(), HTTP: NewHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok")
	}), DefaultHTTPLimits)}
	if err := s.Listen("127.0.0.1:0", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if s.GRPCAddr() == "" || s.HTTPAddr() == "" {
		t.Fatalf("addresses %q %q before Serve", s.GRPCAddr(), s.HTTPAddr())
	}
	var wg sync.WaitGroup
	errc := s.Serve(&wg)
	resp, err := http.Get("http://" + s.HTTPAddr() + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	s.Drain(time.Second, true)
	wg.Wait()
	select {
	case err := <-errc:
		t.Fatalf("a drained server failed: %v", err)
	default:
	}

	never := &Servers{GRPC: grpc.NewServer(), HTTP: NewHTTPServer(http.NotFoundHandler(), DefaultHTTPLimits)}
	if err := never.Listen("127.0.0.1:0", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	addr := never.HTTPAddr()
	never.Drain(time.Second, false)
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatalf("%s still accepts after Drain of servers never served", addr)
	}
	if err := (&Servers{}).Listen("127.0.0.1:0", "256.0.0.1:1"); err == nil || !strings.HasPrefix(err.Error(), "http listen 256.0.0.1:1") {
		t.Fatalf("bad address: %v", err)
	}
}
