package grpcapi

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"runtime/debug"
	"sync"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/allot-dev/allot/pkg/tracing"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Config configures the gRPC front ends. The zero value works: default key map, any
// domain, allot's header fields, every decision enforced.
type Config struct {
	// Keys maps Envoy descriptor entry keys to request attributes; nil means DefaultKeyMap.
	Keys KeyMap
	// Domain, if set, is the only Envoy RLS domain accepted; others are InvalidArgument.
	Domain string
	// Shadow is envoyproxy/ratelimit's global shadow mode (their SHADOW_MODE): every
	// request is checked and counted as usual, each descriptor's status says what was
	// decided, but a request that would be refused is answered OK overall, and counted in
	// allot_enforcer_global_shadow_total. Its header fields then carry no Retry-After.
	Shadow bool
	// QuotaMode makes every descriptor a quota one (their QUOTA_MODE; per descriptor, a
	// rule's quota: true, their quota_mode): the request is OVER_LIMIT only when a
	// non-quota descriptor is, or every quota descriptor is.
	QuotaMode bool
	// Headers picks the header fields added to response_headers_to_add (their
	// LIMIT_RESPONSE_HEADERS_ENABLED and header names are HeadersEnvoyRatelimit).
	Headers Headers
	// LimitOverrides honours a descriptor's own limit (RateLimitDescriptor.limit, which
	// Envoy fills from a route's dynamic metadata), as envoyproxy/ratelimit always does: in
	// a domain that has descriptor rules, that descriptor is limited by the override —
	// requests_per_unit per unit as a token bucket of that burst, counted by the
	// descriptor, in place of the descriptor rules it would match (the rules of the named
	// dimensions still apply). Off (the default), the override is ignored and the rules
	// decide: a caller that can set the override can raise its own limit.
	LimitOverrides bool
}

// Server implements envoy.service.ratelimit.v3.RateLimitService and allot.v1.Allot over
// one Enforcer. Safe for concurrent use; it owns no goroutines.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	allotv1.UnimplementedAllotServer

	e       *enforcer.Enforcer
	keys    KeyMap
	cfg     Config
	headers Headers              // cfg.Headers with the default names filled in
	wire    sync.Pool            // *wireRequest, for the Envoy method (wire.go)
	ov      overrides            // the rules of descriptors' limit overrides (Config.LimitOverrides)
	info    grpc.UnaryServerInfo // the Envoy method, for interceptors
}

// New returns a Server answering with e.
func New(e *enforcer.Enforcer, cfg Config) *Server {
	km := cfg.Keys
	if km == nil {
		km = DefaultKeyMap()
	}
	s := &Server{e: e, keys: km, cfg: cfg, headers: cfg.Headers.withDefaults()}
	s.wire.New = s.newWireRequest
	s.info = grpc.UnaryServerInfo{Server: s, FullMethod: rlsv3.RateLimitService_ShouldRateLimit_FullMethodName}
	return s
}

// Register registers both services on s.
func (s *Server) Register(g grpc.ServiceRegistrar) {
	g.RegisterService(s.rlsServiceDesc(), s)   // the generated service, with pooled messages (wire.go)
	g.RegisterService(s.allotServiceDesc(), s) // allotv1.RegisterAllotServer, malformed messages InvalidArgument
}

// ShouldRateLimit implements Envoy's rate limit service: one check per descriptor, a
// status per descriptor in the request's order, OVER_LIMIT overall if any descriptor is
// over its limit (under quota mode: see Config.QuotaMode; never under Config.Shadow), and
// the header fields Config.Headers asks for in response_headers_to_add (by default the
// RateLimit fields of the deciding descriptor: the first refused one, else the one with
// the fewest tokens left).
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	r, err := s.shouldRateLimit(ctx, req)
	if err != nil {
		return nil, err
	}
	return &r.resp, nil
}

func (s *Server) shouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*reply, error) {
	lim := s.e.Limits()
	if err := s.checkRLS(req, &lim); err != nil {
		s.e.CountInvalid(enforcer.APIEnvoyRLS)
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if s.e.Traced() {
		ctx = tracing.ExtractGRPC(ctx) // Envoy's span, if it sent one: the checks' parent
	}
	descs := req.GetDescriptors()
	var checkBuf [8]enforcer.Request
	var skipBuf [8]bool
	checks, skips := checkBuf[:0], skipBuf[:0]
	if len(descs) <= len(checkBuf) {
		checks, skips = checkBuf[:len(descs)], skipBuf[:len(descs)]
	} else {
		checks, skips = make([]enforcer.Request, len(descs)), make([]bool, len(descs))
	}
	// Every descriptor's entries go to the descriptor rules, when the rules have some, in
	// room lent for the call (a check's input escapes, so a buffer here would not stay on
	// the stack). A swap to rules with descriptor rules during this call is seen by the
	// next one.
	var lent *entryBuf
	var entries []rules.Entry
	snap := s.e.Rules().Current()
	if snap.HasDescriptors() {
		lent = entryBufs.Get().(*entryBuf)
		entries = lent[:0]
		defer lent.release()
	}
	for i, d := range descs {
		skip, err := descriptorRequest(s.keys, &lim, i, d, req.GetHitsAddend(), &checks[i])
		if err == nil {
			checks[i].Attrs.Domain = req.GetDomain()
			if lent != nil {
				from := len(entries)
				entries = appendEntries(entries, d)
				checks[i].Attrs.Entries = entries[from:len(entries):len(entries)]
				if o := d.GetLimit(); o != nil && s.cfg.LimitOverrides && snap.HasDomain(req.GetDomain()) {
					checks[i].Override, err = s.ov.rule(i, o)
				}
			}
			if err == nil {
				err = s.e.Validate(&checks[i])
			}
		}
		if err != nil {
			s.e.CountInvalid(enforcer.APIEnvoyRLS)
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		skips[i] = skip
	}
	s.e.JoinReplaces(checks) // what a rule of one descriptor replaces, it replaces in all
	r := newReply(len(descs))
	resp := &r.resp
	var v verdict
	var quotaBuf [8]bool
	quota := quotaBuf[:0]
	if len(descs) <= len(quotaBuf) {
		quota = quotaBuf[:len(descs)]
	} else {
		quota = make([]bool, len(descs))
	}
	for i := range checks {
		if skips[i] {
			// Negative hits, sent when the stream is done: release an in-flight slot of the
			// descriptor's rules (the oldest: Envoy has no handle), and give hits × cost
			// tokens back to their rate limits (never above the burst). Answered OK with no
			// limit whatever happens; a store error leaves the slot to its timeout and the
			// tokens taken.
			_, _ = s.e.ReleaseOldest(ctx, &checks[i])
			_, _ = s.e.Refund(ctx, &checks[i])
			continue
		}
		d, err := s.e.Check(ctx, &checks[i])
		if err != nil {
			return nil, statusOf(err)
		}
		r.describe(i, &d)
		if d.Rule == "" {
			continue
		}
		quota[i] = s.cfg.QuotaMode || d.QuotaRule()
		v.add(&d, quota[i])
	}
	if v.refused() {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		if s.cfg.Shadow {
			resp.OverallCode = rlsv3.RateLimitResponse_OK
			s.e.CountGlobalShadow(enforcer.APIEnvoyRLS)
			v.decider.Allowed, v.decider.RetryAfter = true, 0 // no Retry-After on an answer that admits
		}
	}
	switch s.cfg.Headers.Style {
	case HeadersEnvoyRatelimit:
		r.envoyHeaders(&s.headers, quota)
	case HeadersIETF:
		if v.have {
			var hb [maxHeaders]enforcer.Header
			r.setHeaders(v.decider.AppendHeaders(hb[:0]))
		}
	}
	return r, nil
}

func (s *Server) checkRLS(req *rlsv3.RateLimitRequest, lim *enforcer.InputLimits) error {
	if req == nil {
		return fmt.Errorf("%w: empty request", enforcer.ErrInvalid)
	}
	if req.GetDomain() == "" {
		// Envoy always names the domain its rate_limits were configured under; a request
		// without one is not from a configured Envoy.
		return fmt.Errorf("%w: domain is empty", enforcer.ErrInvalid)
	}
	if n := len(req.GetDomain()); n > lim.MaxDomainLen {
		return fmt.Errorf("%w: domain is %d bytes, more than %d", enforcer.ErrInvalid, n, lim.MaxDomainLen)
	}
	if s.cfg.Domain != "" && req.GetDomain() != s.cfg.Domain {
		return fmt.Errorf("%w: domain %.64q is not served here (want %q)", enforcer.ErrInvalid, req.GetDomain(), s.cfg.Domain)
	}
	n := len(req.GetDescriptors())
	if n == 0 {
		return fmt.Errorf("%w: no descriptors", enforcer.ErrInvalid)
	}
	if n > lim.MaxDescriptors {
		return fmt.Errorf("%w: %d descriptors, more than %d", enforcer.ErrInvalid, n, lim.MaxDescriptors)
	}
	if h := req.GetHitsAddend(); int64(h) > lim.MaxHits {
		return fmt.Errorf("%w: hits_addend %d, more than %d", enforcer.ErrInvalid, h, lim.MaxHits)
	}
	return nil
}

// entryBuf is room for the entries of a request's descriptors (more go to the heap),
// lent by entryBufs for one call.
type entryBuf [16]rules.Entry

var entryBufs = sync.Pool{New: func() any { return new(entryBuf) }}

// release empties b, so that it keeps no request's strings alive, and returns it.
func (b *entryBuf) release() {
	*b = entryBuf{}
	entryBufs.Put(b)
}

// reply is one Envoy RLS response with room for what it points at: one descriptor's
// status, its limit and reset, and an allowed answer's header fields. It comes from
// replyPool: on the wire path Codec writes it and returns it (wire.go), so an allowed
// answer to one descriptor allocates nothing (more descriptors: four allocations); a reply
// handed out as a message is not returned.
type reply struct {
	resp         rlsv3.RateLimitResponse
	statusPtrs   [1]*rlsv3.RateLimitResponse_DescriptorStatus
	statuses     [1]rlsv3.RateLimitResponse_DescriptorStatus
	limitsBuf    [1]rlsv3.RateLimitResponse_RateLimit
	resetsBuf    [1]durationpb.Duration
	limits       []rlsv3.RateLimitResponse_RateLimit // limits[i] is status i's limit
	resets       []durationpb.Duration               // resets[i] its reset
	headerPtrs   [maxHeaders]*corev3.HeaderValue
	headerValues [maxHeaders]corev3.HeaderValue
}

// maxHeaders is the most header fields Decision.AppendHeaders adds.
const maxHeaders = 5

// newReply returns an OK response of n statuses, each OK with no limit: what a
// negative-hits descriptor is answered.
func newReply(n int) *reply {
	r := replyPool.Get().(*reply)
	r.resp.OverallCode = rlsv3.RateLimitResponse_OK
	statuses := r.statuses[:]
	r.resp.Statuses, r.limits, r.resets = r.statusPtrs[:], r.limitsBuf[:], r.resetsBuf[:]
	if n > len(r.statuses) {
		statuses = make([]rlsv3.RateLimitResponse_DescriptorStatus, n)
		r.resp.Statuses = make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)
		r.limits = make([]rlsv3.RateLimitResponse_RateLimit, n)
		r.resets = make([]durationpb.Duration, n)
	}
	r.resp.Statuses = r.resp.Statuses[:n]
	for i := range n {
		statuses[i].Code = rlsv3.RateLimitResponse_OK
		r.resp.Statuses[i] = &statuses[i]
	}
	return r
}

// describe states d in status i as Envoy expects (the limit as setCurrentLimit says it).
func (r *reply) describe(i int, d *enforcer.Decision) {
	st := r.resp.Statuses[i]
	if !d.Allowed {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if d.Rule == "" {
		return
	}
	st.CurrentLimit = &r.limits[i]
	setCurrentLimit(st.CurrentLimit, d)
	st.LimitRemaining = uint32(min(max(d.Remaining, 0), math.MaxUint32))
	st.DurationUntilReset = &r.resets[i]
	st.DurationUntilReset.Seconds = d.ResetSeconds()
}

// Check implements allot.v1.Allot.
func (s *Server) Check(ctx context.Context, req *allotv1.CheckRequest) (*allotv1.CheckResponse, error) {
	var r enforcer.Request
	if err := allotRequest(req, &r); err != nil {
		s.e.CountInvalid(enforcer.APIAllot)
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := s.e.Validate(&r); err != nil {
		s.e.CountInvalid(enforcer.APIAllot)
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if s.e.Traced() {
		ctx = tracing.ExtractGRPC(ctx)
	}
	d, err := s.e.Check(ctx, &r)
	if err != nil {
		return nil, statusOf(err)
	}
	return allotResponse(&d), nil
}

// Release implements allot.v1.Allot: the slots of a check's handle given back, once.
func (s *Server) Release(ctx context.Context, req *allotv1.ReleaseRequest) (*allotv1.ReleaseResponse, error) {
	if req == nil {
		return nil, status.Error(codes.InvalidArgument, "enforcer: invalid check: empty request")
	}
	err := s.e.Release(ctx, req.GetHandle())
	switch {
	case err == nil:
		return &allotv1.ReleaseResponse{}, nil
	case errors.Is(err, enforcer.ErrInvalid):
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, enforcer.ErrUnknownHandle):
		return nil, status.Error(codes.NotFound, err.Error())
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return nil, statusOf(err)
	}
	return nil, status.Error(codes.Unavailable, err.Error())
}

// Settle implements allot.v1.Allot: a check's cost settled once it is known. Unknown,
// expired or settled already is NOT_FOUND; nothing is settled twice.
func (s *Server) Settle(ctx context.Context, req *allotv1.SettleRequest) (*allotv1.SettleResponse, error) {
	if req == nil {
		return nil, status.Error(codes.InvalidArgument, "enforcer: invalid check: empty request")
	}
	res, err := s.e.Settle(ctx, req.GetHandle(), req.GetCost())
	out := &allotv1.SettleResponse{Settled: int32(res.Settled), Rule: res.Rule, Limit: res.Limit, Remaining: res.Remaining}
	switch {
	case err == nil:
		return out, nil
	case errors.Is(err, enforcer.ErrInvalid):
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, enforcer.ErrUnknownSettle):
		return nil, status.Error(codes.NotFound, err.Error())
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return nil, statusOf(err)
	}
	return nil, status.Error(codes.Unavailable, err.Error())
}

func allotRequest(req *allotv1.CheckRequest, r *enforcer.Request) error {
	if req == nil {
		return fmt.Errorf("%w: empty request", enforcer.ErrInvalid)
	}
	r.Attrs.APIKey, r.Attrs.Plan, r.Attrs.Org, r.Attrs.Endpoint = req.GetApiKey(), req.GetPlan(), req.GetOrg(), req.GetEndpoint()
	r.Hits = int64(req.GetHits())
	r.Settle = req.GetSettle()
	if ip := req.GetIp(); ip != "" {
		a, err := netip.ParseAddr(ip)
		if err != nil {
			return fmt.Errorf("%w: ip %.64q is not an IP address", enforcer.ErrInvalid, ip)
		}
		r.Attrs.IP = a.Unmap()
	}
	return nil
}

func allotResponse(d *enforcer.Decision) *allotv1.CheckResponse {
	resp := &allotv1.CheckResponse{
		Allowed:       d.Allowed,
		Rule:          d.Rule,
		Limit:         d.Limit,
		Quota:         d.Quota,
		WindowSeconds: d.Window,
		Remaining:     d.Remaining,
		ResetMs:       d.Reset.Milliseconds(),
		RetryAfterMs:  d.RetryAfter.Milliseconds(),
		Source:        allotSource(d.Source),
		Handle:        d.Handle,
		SettleHandle:  d.SettleHandle,
	}
	if n := d.ShadowRefusedCount(); n > 0 {
		resp.ShadowRefused = append([]string(nil), d.ShadowRefused()...)
	}
	for _, h := range d.AppendHeaders(make([]enforcer.Header, 0, 5)) {
		resp.Headers = append(resp.Headers, &allotv1.Header{Name: h.Name, Value: h.Value})
	}
	return resp
}

// allotSources is the one mapping of the check path's Source (bucket.Source) to the wire:
// allot.v1.Source spells each source SOURCE_<NAME> (TestAllotSources holds them to it).
// SourceShadow never decides a check, so it has no wire form.
var allotSources = [bucket.NumSources]allotv1.Source{
	bucket.SourceNone:         allotv1.Source_SOURCE_NONE,
	bucket.SourceMemory:       allotv1.Source_SOURCE_MEMORY,
	bucket.SourceRedis:        allotv1.Source_SOURCE_REDIS,
	bucket.SourceLease:        allotv1.Source_SOURCE_LEASE,
	bucket.SourceRefusalCache: allotv1.Source_SOURCE_REFUSAL_CACHE,
	bucket.SourceFallback:     allotv1.Source_SOURCE_FALLBACK,
	bucket.SourceFailClosed:   allotv1.Source_SOURCE_FAIL_CLOSED,
	bucket.SourceFailOpen:     allotv1.Source_SOURCE_FAIL_OPEN,
	bucket.SourceTooLarge:     allotv1.Source_SOURCE_TOO_LARGE,
	bucket.SourceShadow:       allotv1.Source_SOURCE_UNSPECIFIED,
}

func allotSource(s bucket.Source) allotv1.Source {
	if s < bucket.NumSources {
		return allotSources[s]
	}
	return allotv1.Source_SOURCE_UNSPECIFIED
}

// statusOf maps a Check error to a gRPC status: invalid input, or the caller's own
// cancellation or deadline.
func statusOf(err error) error {
	switch {
	case errors.Is(err, enforcer.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// RecoverUnary is a last line of defence: a panic in a handler becomes Internal and a log
// line with the stack instead of a crashed process. Input is validated before it gets
// that far; this only guards against bugs.
func RecoverUnary(log hclog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if p := recover(); p != nil {
				log.Error("panic in gRPC handler", "method", info.FullMethod, "panic", p, "stack", string(debug.Stack()))
				resp, err = nil, status.Error(codes.Internal, "internal error")
			}
		}()
		return h(ctx, req)
	}
}
