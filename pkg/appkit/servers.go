package appkit

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
)

// Servers are a process's gRPC and HTTP servers and their listeners. Listen binds them
// (so GRPCAddr and HTTPAddr answer before anything is served), Serve serves each one bound
// on a goroutine the caller owns, and Drain stops them gracefully within one bound. Set
// GRPC and HTTP before Listen; either may be nil when its address is "". Not safe for
// concurrent Listen, Serve and Drain; the Addr methods are safe once Listen returned.
type Servers struct {
	GRPC *grpc.Server
	HTTP *http.Server
	// Log gets a line when Drain cuts a server short; nil: none.
	Log hclog.Logger

	grpcL, httpL net.Listener
}

// Listen binds grpcAddr and httpAddr ("" binds nothing). A listener already bound stays
// bound after an error: Drain(…, false) closes it.
func (s *Servers) Listen(grpcAddr, httpAddr string) (err error) {
	if grpcAddr != "" {
		if s.grpcL, err = net.Listen("tcp", grpcAddr); err != nil {
			return fmt.Errorf("grpc listen %s: %w", grpcAddr, err)
		}
	}
	if httpAddr != "" {
		if s.httpL, err = net.Listen("tcp", httpAddr); err != nil {
			return fmt.Errorf("http listen %s: %w", httpAddr, err)
		}
	}
	return nil
}

// HTTPOverTLS serves HTTP over TLS with tc: call it after Listen, before Serve. nil: plain
// HTTP.
func (s *Servers) HTTPOverTLS(tc *tls.Config) {
	if tc != nil && s.httpL != nil {
		s.httpL = tls.NewListener(s.httpL, tc)
	}
}

// GRPCAddr is the bound gRPC address ("" when not listening).
func (s *Servers) GRPCAddr() string { return addrOf(s.grpcL) }

// HTTPAddr is the bound HTTP address ("" when not listening).
func (s *Servers) HTTPAddr() string { return addrOf(s.httpL) }

func addrOf(l net.Listener) string {
	if l == nil {
		return ""
	}
	return l.Addr().String()
}

// Serve serves each bound server on a goroutine of wg, until Drain. The channel (buffered:
// the goroutines never block on it) receives a server's failure, "grpc serve: …" or
// "http serve: …"; a server stopped by Drain is no failure.
func (s *Servers) Serve(wg *sync.WaitGroup) <-chan error {
	errc := make(chan error, 2)
	if s.grpcL != nil {
		wg.Go(func() {
			if err := s.GRPC.Serve(s.grpcL); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				errc <- fmt.Errorf("grpc serve: %w", err)
			}
		})
	}
	if s.httpL != nil {
		wg.Go(func() {
			if err := s.HTTP.Serve(s.httpL); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("http serve: %w", err)
			}
		})
	}
	return errc
}

// Drain stops both servers accepting and lets the requests in flight finish, gRPC and
// HTTP at once, for up to timeout; then it cuts what is left. served says whether Serve
// was called: if not, the listeners Listen bound are closed here.
func (s *Servers) Drain(timeout time.Duration, served bool) {
	deadline := time.Now().Add(timeout)
	var grpcDone chan struct{}
	if s.GRPC != nil {
		grpcDone = make(chan struct{})
		go func() { defer close(grpcDone); s.GRPC.GracefulStop() }()
	}
	if s.HTTP != nil {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		if err := s.HTTP.Shutdown(ctx); err != nil {
			s.warn("http drain cut short", "error", err)
			s.HTTP.Close()
		}
		cancel()
	}
	if grpcDone != nil {
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-grpcDone:
			t.Stop()
		case <-t.C:
			s.warn("grpc drain cut short", "drain-timeout", timeout)
			s.GRPC.Stop()
			<-grpcDone
		}
	}
	if !served { // listeners bound by Listen but never handed to Serve
		for _, l := range []net.Listener{s.grpcL, s.httpL} {
			if l != nil {
				l.Close()
			}
		}
	}
}

func (s *Servers) warn(msg string, args ...any) {
	if s.Log != nil {
		s.Log.Warn(msg, args...)
	}
}

// HTTPLimits bound what one HTTP client can hold: a connection that sends its headers
// slower than ReadHeader, or its whole request slower than Read, is closed; a response
// not written within Write is cut; an idle keep-alive connection is closed after Idle;
// headers over MaxHeaderBytes get 431. Without them a few hundred clients holding a body
// they never send exhaust the process's files, and /healthz and the gRPC API go with them.
type HTTPLimits struct {
	ReadHeader, Read, Write, Idle time.Duration
	MaxHeaderBytes                int
}

// DefaultHTTPLimits are the enforcer's: 5 s for headers, 10 s to read and to write, 2 min
// idle, 64 KiB of headers.
var DefaultHTTPLimits = HTTPLimits{ReadHeader: 5 * time.Second, Read: 10 * time.Second,
	Write: 10 * time.Second, Idle: 2 * time.Minute, MaxHeaderBytes: 64 << 10}

// NewHTTPServer is an http.Server of h under l.
func NewHTTPServer(h http.Handler, l HTTPLimits) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: l.ReadHeader, ReadTimeout: l.Read,
		WriteTimeout: l.Write, IdleTimeout: l.Idle, MaxHeaderBytes: l.MaxHeaderBytes}
}
