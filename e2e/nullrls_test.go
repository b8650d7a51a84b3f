package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	_ "net/http/pprof" // served only with nullPprofEnv
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/allot-dev/allot/pkg/enforcer/app"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
)

// nullRLSEnv, when set to a listen address, turns this test binary into the null RLS server
// of BenchmarkEnforcerRLS: it serves on that address until SIGINT or SIGTERM and exits,
// running no test. The benchmark starts it as a child process (os.Args[0]) so that its CPU
// is read from /proc exactly as the enforcer's is.
const nullRLSEnv = "ALLOT_BENCH_NULL_RLS"

// init runs before TestMain: a child started as the null server must not run the tests.
func init() {
	if addr := os.Getenv(nullRLSEnv); addr != "" {
		if err := serveNullRLS(addr); err != nil {
			fmt.Fprintln(os.Stderr, "null RLS server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// nullRLS is the floor the enforcer is measured against: an Envoy RLS server over the same
// gRPC stack (grpc-go, the same generated code, the transport options and GC target of
// cmd/enforcer)
// that answers every request OK and does nothing else — no validation, no matching, no
// store, no metrics. It builds one response per call, as any server must.
type nullRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	canned *rlsv3.RateLimitResponse // ALLOT_BENCH_NULL_SHAPED: every answer is this one
}

func (n nullRLS) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if n.canned != nil {
		return n.canned, nil // read-only: concurrent marshalling of one message is safe
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// nullShapedEnv, when set (in the benchmark's environment; it is passed on to the null
// server), makes the null server answer every check with one prebuilt response of the shape
// of allot's allowed answer (a status with its limit, remaining and reset; the three
// RateLimit header fields): a floor that sends what allot sends, so that the ratio left is
// allot's work alone and not the size of its answer (which the load generator pays to
// decode). An experiment, not the benchmark's floor.
const nullShapedEnv = "ALLOT_BENCH_NULL_SHAPED"

func cannedResponse() *rlsv3.RateLimitResponse {
	return &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
			Code: rlsv3.RateLimitResponse_OK,
			CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{
				Name: "default/second", RequestsPerUnit: 500, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND,
			},
			LimitRemaining:     412,
			DurationUntilReset: &durationpb.Duration{Seconds: 1},
		}},
		ResponseHeadersToAdd: []*corev3.HeaderValue{
			{Key: "RateLimit-Policy", Value: `"default/second";q=500;w=1`},
			{Key: "RateLimit", Value: `"default/second";r=412;t=1`},
			{Key: "X-RateLimit-Counted-By", Value: "api_key"},
		},
	}
}

// nullPprofEnv, when set to a listen address in the null server's environment, serves
// net/http/pprof there (the benchmark sets it for ALLOT_BENCH_TRACE and
// ALLOT_BENCH_PROFILE_OPEN, so both servers are traced alike).
const nullPprofEnv = "ALLOT_BENCH_NULL_PPROF"

func serveNullRLS(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	if a := os.Getenv(nullPprofEnv); a != "" {
		pl, err := net.Listen("tcp", a)
		if err != nil {
			return err
		}
		go http.Serve(pl, nil) //nolint:errcheck // ends with the process
	}
	// The runtime settings and transport options of cmd/enforcer (app.ApplyRuntime, and
	// pkg/enforcer/app listen), so the floor is the same gRPC server in the same Go
	// runtime, not a differently tuned one.
	cfg := app.DefaultConfig()
	_, stopGC := app.ApplyRuntime(&cfg, os.Getenv)
	defer stopGC()
	s := grpc.NewServer(
		grpc.MaxRecvMsgSize(64<<10),
		grpc.MaxConcurrentStreams(1024),
		grpc.NumStreamWorkers(uint32(32*runtime.GOMAXPROCS(0))),
	)
	var n nullRLS
	if os.Getenv(nullShapedEnv) != "" {
		n.canned = cannedResponse()
	}
	rlsv3.RegisterRateLimitServiceServer(s, n)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	select {
	case <-sig:
		s.GracefulStop()
		return <-done
	case err := <-done:
		return err
	}
}
