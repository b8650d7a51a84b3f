package xds

// Source: the state-of-the-world subscription, its acknowledgements and its reconnects.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/client/sotw/v3"
	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/envoyrl"
	"github.com/allot-dev/allot/pkg/etcdwatch"
	"github.com/allot-dev/allot/pkg/routine"
)

// MaxNackBytes bounds the error detail a NACK carries back to the server.
const MaxNackBytes = 4 << 10

// Config is a Source's settings. The names of envoyproxy/ratelimit's environment
// variables are given for each; they mean the same here.
type Config struct {
	// Server is the management server's address, host:port (CONFIG_GRPC_XDS_SERVER_URL).
	Server string
	// NodeID is the node the server keys its snapshots by (CONFIG_GRPC_XDS_NODE_ID;
	// "default" when empty, as there).
	NodeID string
	// NodeMetadata is sent as the node's metadata (CONFIG_GRPC_XDS_NODE_METADATA).
	NodeMetadata map[string]string
	// Headers are added to the stream's gRPC metadata
	// (CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS).
	Headers map[string]string
	// Creds secures the connection (CONFIG_GRPC_XDS_SERVER_USE_TLS and its files); nil
	// means plaintext.
	Creds credentials.TransportCredentials
	// Merge joins the resources of one domain (MERGE_DOMAIN_CONFIG); otherwise a domain
	// in two resources is an error, as two files would be.
	Merge bool
	// Backoff paces the reconnects (XDS_CLIENT_BACKOFF_INITIAL_INTERVAL, _MAX_INTERVAL,
	// _JITTER); zero: 1 s doubling to 30 s with jitter.
	Backoff etcdwatch.Backoff
	// MaxMsgBytes bounds a response (XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES); 0: 16 MiB.
	MaxMsgBytes int
	// Update receives every set the Source accepts, from its goroutine, in order: the
	// whole configuration, one Config a domain. It must not block for long.
	Update func([]*envoyrl.Config)
	Clock  clock.Clock
	Log    hclog.Logger
}

// Status is what a Source has done so far (for explain, the admin API and tests).
type Status struct {
	// Accepted counts responses acknowledged; Rejected those refused (NACKed) in whole
	// or part.
	Accepted, Rejected int
	// Err is the last response's problem (nil once a response was accepted whole).
	Err error
	// Resources names the resources of the configuration in force.
	Resources []string
}

// Source subscribes to RateLimitConfig resources over xDS (state of the world, on the
// aggregated discovery stream, as envoyproxy/ratelimit does with CONFIG_TYPE=GRPC_XDS_SOTW)
// and hands each accepted configuration to Config.Update.
//
// The guarantees are those of allot's own rules: a broken resource never replaces a good
// one nor holds the others hostage. A response is checked resource by resource as files
// would be (FromProto); a resource that fails keeps its last good version (or stays out
// if it never had one), the others are applied, and the response is NACKed with every
// problem named — what Envoy itself does with a partly invalid update. A response whose
// resources conflict with each other (one domain twice) changes nothing and is NACKed. A
// lost connection keeps the configuration in force and reconnects with backoff; the
// server then sends its whole state again.
type Source struct {
	cfg  Config
	loop routine.Routine

	mu     sync.Mutex // guards good and st
	good   map[string]*envoyrl.Config
	st     Status
	bo     etcdwatch.Backoff
	waited chan struct{} // tests: a backoff wait began (buffered, one pending)
}

// New checks cfg and returns a Source; Start subscribes.
func New(cfg Config) (*Source, error) {
	switch {
	case cfg.Server == "":
		return nil, errors.New("xds: no server address (CONFIG_GRPC_XDS_SERVER_URL)")
	case cfg.Update == nil:
		return nil, errors.New("xds: Config.Update is nil")
	case cfg.Backoff.Max < cfg.Backoff.Min:
		return nil, fmt.Errorf("xds: backoff %v..%v, want Min <= Max", cfg.Backoff.Min, cfg.Backoff.Max)
	case cfg.MaxMsgBytes < 0:
		return nil, fmt.Errorf("xds: MaxMsgBytes %d < 0", cfg.MaxMsgBytes)
	}
	if cfg.NodeID == "" {
		cfg.NodeID = "default"
	}
	if cfg.Backoff.Min <= 0 {
		cfg.Backoff = etcdwatch.Backoff{Min: time.Second, Max: 30 * time.Second, Jitter: true}
	}
	if cfg.MaxMsgBytes == 0 {
		cfg.MaxMsgBytes = 16 << 20
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real()
	}
	if cfg.Log == nil {
		cfg.Log = hclog.NewNullLogger()
	}
	return &Source{cfg: cfg, good: map[string]*envoyrl.Config{}, bo: cfg.Backoff, waited: make(chan struct{}, 1)}, nil
}

// Start subscribes in a goroutine of the Source's own, until Close.
func (s *Source) Start() error { return s.loop.Start(s.run) }

// Close ends the subscription and waits for its goroutine.
func (s *Source) Close() error {
	s.loop.Close()
	return nil
}

// Status returns what the Source has done so far.
func (s *Source) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	st.Resources = slices.Sorted(maps.Keys(s.good))
	return st
}

func (s *Source) run(ctx context.Context) {
	for {
		err := s.session(ctx)
		if ctx.Err() != nil {
			return
		}
		d := s.bo.Next()
		s.cfg.Log.Warn("xDS stream ended; reconnecting", "server", s.cfg.Server, "in", d, "error", err)
		if !s.wait(ctx, d) {
			return
		}
	}
}

// wait waits d on the Source's clock; false if ctx ended first.
func (s *Source) wait(ctx context.Context, d time.Duration) bool {
	select {
	case s.waited <- struct{}{}:
	default:
	}
	t := s.cfg.Clock.NewTimer(d)
	select {
	case <-ctx.Done():
		t.Stop()
		return false
	case <-t.C():
		return true
	}
}

// sameResources says whether two responses carry the same resources, byte for byte, in
// any order (a server may list a snapshot's resources in a different order each time).
func sameResources(a, b *sotw.Response) bool {
	return slices.EqualFunc(sorted(a.Resources), sorted(b.Resources), func(x, y *anypb.Any) bool {
		return x.GetTypeUrl() == y.GetTypeUrl() && bytes.Equal(x.GetValue(), y.GetValue())
	})
}

func sorted(rs []*anypb.Any) []*anypb.Any {
	return slices.SortedFunc(slices.Values(rs), func(x, y *anypb.Any) int {
		if c := strings.Compare(x.GetTypeUrl(), y.GetTypeUrl()); c != 0 {
			return c
		}
		return bytes.Compare(x.GetValue(), y.GetValue())
	})
}

// session is one connection: subscribe, then check and answer each response until the
// stream fails or ctx ends.
func (s *Source) session(ctx context.Context) error {
	creds := s.cfg.Creds
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(s.cfg.Server, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(s.cfg.MaxMsgBytes)))
	if err != nil {
		return err
	}
	defer conn.Close()
	if len(s.cfg.Headers) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, metadata.New(s.cfg.Headers))
	}
	node := &core.Node{Id: s.cfg.NodeID, UserAgentName: "allot"}
	if len(s.cfg.NodeMetadata) > 0 {
		m := make(map[string]any, len(s.cfg.NodeMetadata))
		for k, v := range s.cfg.NodeMetadata {
			m[k] = v
		}
		if node.Metadata, err = structpb.NewStruct(m); err != nil {
			return err
		}
	}
	c := sotw.NewADSClient(ctx, node, TypeURL)
	if err := c.InitConnect(conn); err != nil {
		return err
	}
	var prev *sotw.Response // the last response, if it was refused
	for {
		resp, err := c.Fetch()
		if err != nil {
			return err
		}
		if prev != nil && sameResources(prev, resp) {
			// The server sent again what was refused (go-control-plane answers a NACK at
			// once with the version it holds): answer again after a backoff, not in a loop.
			if !s.wait(ctx, s.bo.Next()) {
				return ctx.Err()
			}
			if err := c.Nack(s.Status().Err.Error()); err != nil {
				return err
			}
			continue
		}
		s.bo.Reset() // the server answers: the next failure starts from Min
		prev = nil
		if problem := s.apply(resp); problem != nil {
			prev = resp
			msg := problem.Error()
			if len(msg) > MaxNackBytes {
				msg = msg[:MaxNackBytes] + "…"
			}
			s.cfg.Log.Error("xDS rate limit configuration refused (NACK); the last good one of each resource stays in force", "error", msg)
			err = c.Nack(msg)
		} else {
			err = c.Ack()
		}
		if err != nil {
			return err
		}
	}
}

// apply checks one response and hands the configuration it leaves in force to Update.
// It returns what was wrong with the response (nil: acknowledge it whole).
func (s *Source) apply(resp *sotw.Response) error {
	var errs []error
	pbs := make([]*rlconf.RateLimitConfig, 0, len(resp.Resources))
	for _, a := range resp.Resources {
		pb, err := decode(a)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		pbs = append(pbs, pb)
	}
	// By name, so the problems are named in the same order whatever the server's.
	slices.SortStableFunc(pbs, func(x, y *rlconf.RateLimitConfig) int { return strings.Compare(x.GetName(), y.GetName()) })
	next := make(map[string]*envoyrl.Config, len(pbs))
	s.mu.Lock()
	for _, pb := range pbs {
		if _, dup := next[pb.GetName()]; dup {
			errs = append(errs, fmt.Errorf("xds:%s: two resources of that name in one response", pb.GetName()))
			continue
		}
		cfg, err := FromProto(pb)
		if err != nil {
			errs = append(errs, err)
			if old, ok := s.good[pb.GetName()]; ok {
				next[pb.GetName()] = old
			}
			continue
		}
		next[pb.GetName()] = cfg
	}
	cfgs := make([]*envoyrl.Config, 0, len(next))
	for _, n := range slices.Sorted(maps.Keys(next)) {
		cfgs = append(cfgs, next[n])
	}
	set, err := envoyrl.Combine(cfgs, s.cfg.Merge)
	if err != nil {
		errs = append(errs, err)
		set = nil
	} else {
		s.good = next
	}
	problem := errors.Join(errs...)
	s.st.Err = problem
	if problem != nil {
		s.st.Rejected++
	} else {
		s.st.Accepted++
	}
	s.mu.Unlock()
	if set != nil {
		for _, c := range set {
			for _, w := range c.Warnings {
				s.cfg.Log.Warn("xDS rate limit configuration", "warning", w)
			}
		}
		s.cfg.Update(set)
	}
	return problem
}
