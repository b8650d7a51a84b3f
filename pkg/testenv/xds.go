package testenv

import (
	"context"
	"net"
	"sync"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
)

// XDS is go-control-plane's own management server on loopback, serving state-of-the-world
// RateLimitConfig snapshots to one node as Envoy Gateway serves its rate limit service,
// and recording what the client answered (an ACK carries no error detail; a NACK its
// message). The tests of pkg/envoyrl/xds, the enforcer app's and e2e's Envoy
// Gateway-style run share it. Stopped at the test's end.
type XDS struct {
	t     testing.TB
	node  string
	cache cachev3.SnapshotCache
	addr  string

	mu      sync.Mutex
	gs      *grpc.Server
	done    chan struct{}
	answers []*discovery.DiscoveryRequest
}

// StartXDS starts the server on addr ("" for a free loopback port) for node.
func StartXDS(t testing.TB, node, addr string) *XDS {
	t.Helper()
	x := &XDS{t: t, node: node, cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)}
	x.serve(addr)
	t.Cleanup(x.Stop)
	return x
}

// Addr is the server's host:port.
func (x *XDS) Addr() string { return x.addr }

func (x *XDS) serve(addr string) {
	x.t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		x.t.Fatal(err)
	}
	x.addr = lis.Addr().String()
	cb := serverv3.CallbackFuncs{StreamRequestFunc: func(_ int64, req *discovery.DiscoveryRequest) error {
		x.mu.Lock()
		x.answers = append(x.answers, req)
		x.mu.Unlock()
		return nil
	}}
	gs := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(gs, serverv3.NewServer(context.Background(), x.cache, cb))
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(lis) }()
	x.mu.Lock()
	x.gs, x.done = gs, done
	x.mu.Unlock()
}

// Stop stops the server (its streams end) and waits for it; Restart serves again on the
// same address with the same snapshots.
func (x *XDS) Stop() {
	x.mu.Lock()
	gs, done := x.gs, x.done
	x.gs, x.done = nil, nil
	x.mu.Unlock()
	if gs != nil {
		gs.Stop()
		<-done
	}
}

// Restart serves again on the address Stop left.
func (x *XDS) Restart() {
	x.t.Helper()
	x.serve(x.addr)
}

// Set makes res, at version, the node's RateLimitConfig resources.
func (x *XDS) Set(version string, res ...*rlconf.RateLimitConfig) {
	x.t.Helper()
	rs := make([]types.Resource, len(res))
	for i, r := range res {
		rs[i] = r
	}
	snap, err := cachev3.NewSnapshot(version, map[resourcev3.Type][]types.Resource{resourcev3.RateLimitConfigType: rs})
	if err != nil {
		x.t.Fatal(err)
	}
	if err := x.cache.SetSnapshot(context.Background(), x.node, snap); err != nil {
		x.t.Fatal(err)
	}
}

// LastAnswer is the client's last answer to a response (a request with a nonce), nil
// before any.
func (x *XDS) LastAnswer() *discovery.DiscoveryRequest {
	x.mu.Lock()
	defer x.mu.Unlock()
	for i := len(x.answers) - 1; i >= 0; i-- {
		if x.answers[i].GetResponseNonce() != "" {
			return x.answers[i]
		}
	}
	return nil
}
