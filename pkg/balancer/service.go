package balancer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/allot-dev/allot/pkg/certs"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/routine"
	"github.com/allot-dev/allot/pkg/tracing"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DashboardsSuffix, after the election prefix, is where each replica publishes its
// dashboard URL, keyed by its report address (ServiceConfig.Dashboard).
const DashboardsSuffix = "-dashboards/"

// ErrFenced: an etcd write was refused because this replica's election key is gone or
// was recreated (another replica leads). The replica steps down.
var ErrFenced = errors.New("balancer: fenced: no longer the leader")

// ErrClosed is returned by Start after Close.
var ErrClosed = errors.New("balancer: closed")

// ServiceConfig configures a Service. Start from DefaultServiceConfig.
type ServiceConfig struct {
	// Core configures each term's core; LeaderRev is set by the election. Core.Limits is
	// required (RuleTable.Limits in cmd/balancer).
	Core CoreConfig
	// Etcd is the client for the election and the share sets; required. The Service does
	// not close it.
	Etcd *clientv3.Client
	// ElectionPrefix: default contract.ElectionPrefix.
	ElectionPrefix string
	// SharesPrefix is where share sets are published. Default contract.SharesPrefix.
	SharesPrefix string
	// Advertise is this replica's report API address ("host:port"), the campaign value
	// standbys redirect to. Required.
	Advertise string
	// Dashboard is this replica's dashboard URL. Each term's session publishes it under
	// ElectionPrefix+DashboardsSuffix+Advertise (with the session's lease, so it goes with
	// the replica), and LeaderDashboard reads the leader's there: a standby's dashboard
	// links to the leader's. "" publishes nothing.
	Dashboard string
	// SessionTTL is the election lease: a leader that stops refreshing it (dead, cut off)
	// loses leadership after it, and its writes fail from then on. Whole seconds ≥ 1s.
	// Default 10s.
	SessionTTL time.Duration
	// TickEvery is the longest between two ticks of Core.Tick; reports that ask for a
	// tick (AsksForTick) and a plan's next step while the control plane is quiet
	// (Core.NextTick) bring one sooner. Default 1s.
	TickEvery time.Duration
	// WriteTimeout bounds each etcd transaction and the initial read. Default 5s.
	WriteTimeout time.Duration
	// MaxChunkBytes bounds each chunk's encoding (each chunk is one Txn). Default
	// contract.MaxChunkBytes.
	MaxChunkBytes int
	// RegionFromPeer, when true, takes a report only over mutual TLS and only for the
	// region the client certificate names (certs.RegionOf: the URI SAN
	// spiffe://allot/region/<region>/enforcer); any other report is refused
	// (PermissionDenied) and counted as allot_balancer_reports_total{result="forbidden"}.
	// Set it whenever the report server verifies client certificates (pkg/balancer/app
	// does with listen.tls.client_ca_file).
	RegionFromPeer bool
	// Clock, Logger, Registerer: defaults the wall clock, a null logger, a new registry.
	Clock      clock.Clock
	Logger     hclog.Logger
	Registerer prometheus.Registerer
	// Tracer, if not nil, makes spans of each report received (a child of the enforcer's
	// report span, whose trace context comes with the RPC), each recompute and each
	// publication (see pkg/tracing); nil: none.
	Tracer trace.Tracer
}

// DefaultServiceConfig returns the defaults above (Core from DefaultCoreConfig).
func DefaultServiceConfig() ServiceConfig {
	return ServiceConfig{
		Core: DefaultCoreConfig(), ElectionPrefix: contract.ElectionPrefix, SharesPrefix: contract.SharesPrefix,
		SessionTTL: 10 * time.Second, TickEvery: time.Second, WriteTimeout: 5 * time.Second,
		MaxChunkBytes: contract.MaxChunkBytes,
	}
}

// Validate names the bad fields and values.
func (c *ServiceConfig) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("balancer: ServiceConfig."+format, a...))
	}
	if c.Etcd == nil {
		bad("Etcd is nil")
	}
	if c.ElectionPrefix == "" {
		bad("ElectionPrefix is empty")
	}
	if c.SharesPrefix == "" {
		bad("SharesPrefix is empty")
	}
	if c.Advertise == "" {
		bad("Advertise is empty: standbys would have no address to redirect to")
	}
	if c.SessionTTL < time.Second || c.SessionTTL%time.Second != 0 {
		bad("SessionTTL %v, must be whole seconds >= 1s", c.SessionTTL)
	}
	if c.TickEvery <= 0 {
		bad("TickEvery %v, must be > 0", c.TickEvery)
	}
	if c.WriteTimeout <= 0 {
		bad("WriteTimeout %v, must be > 0", c.WriteTimeout)
	}
	if c.MaxChunkBytes <= 0 || c.MaxChunkBytes > contract.MaxChunkBytes {
		bad("MaxChunkBytes %d, must be in (0, %d]", c.MaxChunkBytes, contract.MaxChunkBytes)
	}
	core := c.Core
	core.LeaderRev = 1 // set per term
	if err := core.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Service is one balancer replica: it campaigns for leadership in etcd; as leader it runs
// a Core (a new one per term, restored from the persisted set), publishes its share sets
// with fenced transactions and takes reports; as standby it answers reports with the
// leader's address. A term ends when the session is lost, a write is fenced or Close is
// called; the replica then campaigns again. Safe for concurrent use; Close is idempotent
// and waits for the goroutine Start started.
type Service struct {
	allotv1.UnimplementedBalancerServer

	mu         sync.Mutex // mu guards core, rev, leaderAddr, leaderRev, leaderAt, kickedBy
	core       *Core
	rev        int64
	leaderAddr string
	leaderRev  int64
	leaderAt   time.Time
	kickedBy   trace.SpanContext // the span of the last report that kicked the loop (a link)

	cfg    ServiceConfig
	log    hclog.Logger
	m      *metrics
	tracer trace.Tracer    // cfg.Tracer, or a no-op one
	run    routine.Routine // the campaign loop Start begins; its context ends at Close
	kick   chan struct{}   // cap 1: a report the leader should tick for at once
	// cleanup is the context of the etcd calls that undo a term (Resign, the lease's
	// revoke, and the resignation Campaign makes when it is cancelled): it outlives the
	// loop's context by at most WriteTimeout, counted from Close, so Close is bounded with
	// etcd down.
	cleanup     context.Context
	stopCleanup context.CancelFunc
	// elect is cfg.Etcd seen through a client whose Ctx() is cleanup: concurrency.Election
	// resigns a cancelled Campaign with the client's Ctx(), which for cfg.Etcd lasts until
	// the client is closed — with etcd down, forever (issue 28). It shares cfg.Etcd's
	// connection and is never closed itself (closing it would close cfg.Etcd's lessor and
	// watcher).
	elect *clientv3.Client

	// beforeWrite, in tests, runs before each publication is written (it may block).
	beforeWrite func(p *Publication)
}

// NewService validates cfg and registers the metrics. It does no I/O: call Start.
func NewService(cfg ServiceConfig) (*Service, error) {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real()
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, log: cfg.Logger, kick: make(chan struct{}, 1), tracer: cfg.Tracer}
	if s.tracer == nil {
		s.tracer = noop.NewTracerProvider().Tracer("")
	}
	s.cleanup, s.stopCleanup = context.WithCancel(context.Background())
	s.elect = clientv3.NewCtxClient(s.cleanup, clientv3.WithZapLogger(cfg.Etcd.GetLogger()))
	s.elect.KV, s.elect.Lease, s.elect.Watcher = cfg.Etcd.KV, cfg.Etcd.Lease, cfg.Etcd.Watcher
	s.m = newMetrics(cfg.Registerer, s)
	return s, nil
}

// Start begins campaigning in the background. It returns ErrClosed after Close; a second
// Start does nothing.
func (s *Service) Start() error {
	if err := s.run.Start(s.loop); errors.Is(err, routine.ErrClosed) {
		return ErrClosed
	}
	return nil // or routine.ErrStarted: already campaigning
}

// Close resigns leadership (the session's lease is revoked, so a standby takes over at
// once rather than after SessionTTL) and waits for the background goroutine. It is
// bounded whether etcd answers or not: the resignation and the revoke get WriteTimeout
// from the first Close, after which they are cancelled (the lease then expires on its own
// after SessionTTL). Idempotent: every call waits.
func (s *Service) Close() error {
	bound := time.AfterFunc(s.cfg.WriteTimeout, s.stopCleanup)
	defer bound.Stop()
	s.run.Close() // ends the loop's context and waits for it
	s.stopCleanup()
	return nil
}

// Leading reports whether this replica leads now, and its term's fencing token.
func (s *Service) Leading() (bool, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.core != nil, s.rev
}

// Core returns the current term's core, nil while standing by. Read it (Stats,
// Identity, Top); the Service alone drives it.
func (s *Service) Core() *Core { return s.currentCore() }

// Leader returns the leader's report address and term: this replica's own while it leads,
// else as last read from the election (at most a second old; "" and 0 when none is known).
func (s *Service) Leader(ctx context.Context) (addr string, term int64) { return s.leader(ctx) }

// currentCore returns the current term's core (nil while standing by).
func (s *Service) currentCore() *Core {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.core
}

func (s *Service) loop(ctx context.Context) {
	wait := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := s.term(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil || errors.Is(err, ErrFenced) || errors.Is(err, errSessionLost) {
			wait = 100 * time.Millisecond // campaign again at once
		} else {
			wait = min(2*wait, 5*time.Second)
		}
		if err != nil {
			s.log.Warn("balancer term ended; campaigning again", "error", err, "retry-in", wait)
		}
		t := s.cfg.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

var errSessionLost = errors.New("balancer: election session lost")

// term campaigns, then leads until the session ends, a write is fenced or Close (ctx
// ends).
func (s *Service) term(ctx context.Context) error {
	// The session outlives ctx by its revoke, so Close revokes the lease at once rather
	// than leaving it to expire (with ctx as the session's context the revoke would be
	// cancelled before it is sent). Close still aborts a session being created.
	sessCtx, sessCancel := context.WithCancel(s.cleanup)
	defer sessCancel()
	abort := context.AfterFunc(ctx, sessCancel)
	sess, err := concurrency.NewSession(s.elect, concurrency.WithTTL(int(s.cfg.SessionTTL/time.Second)), concurrency.WithContext(sessCtx))
	if !abort() { // closed meanwhile
		if err == nil {
			sess.Orphan()
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("while creating the election session: %w", err)
	}
	defer sess.Close() // revokes the lease (bounded by its TTL and Close's bound): our election key goes with it
	// This replica's dashboard URL, for the standbys' pages; a failure costs only that link.
	if s.cfg.Dashboard != "" {
		pctx, cancel := context.WithTimeout(ctx, s.cfg.WriteTimeout)
		_, err := s.cfg.Etcd.Put(pctx, s.cfg.ElectionPrefix+DashboardsSuffix+s.cfg.Advertise, s.cfg.Dashboard, clientv3.WithLease(sess.Lease()))
		cancel()
		if err != nil && ctx.Err() == nil {
			s.log.Warn("could not publish this replica's dashboard address", "error", err)
		}
	}
	e := concurrency.NewElection(sess, s.cfg.ElectionPrefix)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watch := make(chan struct{})
	go func() { // end the campaign if the session dies while waiting
		defer close(watch)
		select {
		case <-sess.Done():
			cancel()
		case <-cctx.Done():
		}
	}()
	err = e.Campaign(cctx, s.cfg.Advertise)
	cancel()
	<-watch
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("while campaigning: %w", err)
	}
	return s.lead(ctx, sess, e)
}

// lead runs one term as leader, until ctx ends (Close), the session is lost or a write is
// fenced.
func (s *Service) lead(ctx context.Context, sess *concurrency.Session, e *concurrency.Election) error {
	rev, key := e.Rev(), e.Key()
	log := s.log.With("term", rev)
	cfg := s.cfg.Core
	cfg.LeaderRev = rev
	core, err := NewCore(cfg)
	if err != nil {
		return err
	}
	pub := &publisher{cli: s.cfg.Etcd, prefix: s.cfg.SharesPrefix, key: key, rev: rev, maxBytes: s.cfg.MaxChunkBytes,
		timeout: s.cfg.WriteTimeout, m: s.m}
	head, entries, members, membersOK, found, err := pub.load(ctx, log)
	if err != nil {
		return fmt.Errorf("while reading the persisted shares: %w", err)
	}
	if found {
		if err := core.Restore(head, entries); err != nil {
			return err
		}
		if !membersOK {
			log.Warn("no readable members beside the persisted set: every region is held as if one of its enforcers were cut off, for the enforcers' stale period")
		}
		if err := core.RestoreMembers(members, membersOK); err != nil {
			return err
		}
	}
	log.Info("leading", "advertise", s.cfg.Advertise, "restored-version", head.Version, "restored-entries", len(entries), "restored-from-term", head.LeaderRev)
	s.mu.Lock()
	s.core, s.rev = core, rev
	s.leaderAddr, s.leaderRev, s.leaderAt = s.cfg.Advertise, rev, s.cfg.Clock.Now()
	s.mu.Unlock()
	s.m.setLeader(rev)
	defer func() {
		s.mu.Lock()
		s.core, s.rev, s.leaderAt = nil, 0, time.Time{}
		s.mu.Unlock()
		s.m.setLeader(0)
	}()
	t := s.cfg.Clock.NewTimer(0)
	defer func() { t.Stop() }()
	for {
		select {
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(s.cleanup, s.cfg.WriteTimeout)
			err := e.Resign(rctx)
			cancel()
			log.Info("resigned", "error", err)
			return nil
		case <-sess.Done():
			log.Warn("election session lost; stepping down")
			return errSessionLost
		case <-t.C():
		case <-s.kick:
			t.Stop()
		}
		before, _, _ := core.progress()
		kicked := s.kickedSpan()
		began := time.Now()
		p := core.Tick(s.cfg.Clock.Now())
		after, tracked, pending := core.progress()
		var links []trace.Link // the spans': the report that asked for a tick, then this tick's recompute
		if kicked.IsValid() && (after != before || p != nil) {
			links = append(links, trace.Link{SpanContext: kicked})
			s.kickUsed(kicked)
		}
		if after != before {
			took := time.Since(began)
			s.m.recompute.Observe(took.Seconds())
			_, span := s.tracer.Start(ctx, tracing.SpanBalancerRecompute, trace.WithTimestamp(began), trace.WithLinks(links...),
				trace.WithAttributes(tracing.AttrTerm.Int64(rev), tracing.AttrTracked.Int(tracked),
					tracing.AttrPending.Int(pending), tracing.AttrPublishes.Bool(p != nil && p.Changed)))
			span.End(trace.WithTimestamp(began.Add(took)))
			links = append(links, trace.Link{SpanContext: span.SpanContext()})
		}
		if p != nil {
			if s.beforeWrite != nil {
				s.beforeWrite(p)
			}
			err := s.publish(ctx, pub, p, links)
			switch {
			case errors.Is(err, ErrFenced):
				log.Warn("write refused by etcd: another replica leads; stepping down", "version", p.Head.Version)
				return err
			case err != nil:
				log.Warn("could not publish shares; retrying", "version", p.Head.Version, "error", err)
			default:
				core.Published(p, s.cfg.Clock.Now())
				if p.Changed {
					log.Debug("published", "version", p.Head.Version, "entries", p.Head.Entries, "phase", p.Head.Phase)
				}
			}
		}
		t = s.cfg.Clock.NewTimer(TickWait(core, s.cfg.Clock.Now(), s.cfg.TickEvery))
	}
}

// TickWait is how long the leader's loop sleeps after a tick at now: TickEvery, or less
// when the core has a step due sooner (Core.NextTick), at least a millisecond.
func TickWait(core *Core, now time.Time, every time.Duration) time.Duration {
	if next := core.NextTick(now); !next.IsZero() {
		return min(every, max(next.Sub(now), time.Millisecond))
	}
	return every
}

// publish writes p (publisher.write) as a span (tracing.SpanBalancerPublish) linked to
// links.
func (s *Service) publish(ctx context.Context, pub *publisher, p *Publication, links []trace.Link) error {
	ctx, span := s.tracer.Start(ctx, tracing.SpanBalancerPublish, trace.WithLinks(links...),
		trace.WithAttributes(tracing.AttrTerm.Int64(p.Head.LeaderRev), tracing.AttrVersion.Int64(int64(p.Head.Version)),
			tracing.AttrEntries.Int(p.Head.Entries), tracing.AttrChanged.Bool(p.Changed), tracing.AttrPhase.String(p.Head.Phase)))
	defer span.End()
	err := pub.write(ctx, p)
	result := "ok"
	switch {
	case errors.Is(err, ErrFenced):
		result = "fenced"
	case err != nil:
		result = "error"
	}
	span.SetAttributes(tracing.AttrResult.String(result))
	if err != nil {
		span.SetStatus(otelcodes.Error, err.Error())
	}
	return err
}

// kickedSpan returns the span of the report that last asked for a tick (read before the
// tick: that report was ingested, so the tick sees it). A tick that recomputes or
// publishes links its spans to it and forgets it (kickUsed); one that does neither leaves
// it to the next.
func (s *Service) kickedSpan() trace.SpanContext {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kickedBy
}

// kickUsed forgets sc unless a newer report has asked for a tick since.
func (s *Service) kickUsed(sc trace.SpanContext) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kickedBy.Equal(sc) {
		s.kickedBy = trace.SpanContext{}
	}
}

// LeaderDashboard returns the leader's dashboard URL as it published it (see
// ServiceConfig.Dashboard): this replica's own while it leads, "" when no leader or no URL
// is known. It reads etcd (bounded by a second).
func (s *Service) LeaderDashboard(ctx context.Context) string {
	addr, _ := s.leader(ctx)
	if addr == "" {
		return ""
	}
	if addr == s.cfg.Advertise {
		return s.cfg.Dashboard
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := s.cfg.Etcd.Get(ctx, s.cfg.ElectionPrefix+DashboardsSuffix+addr)
	if err != nil || len(resp.Kvs) == 0 {
		return ""
	}
	return string(resp.Kvs[0].Value)
}

// leaderLookupEvery bounds how often a standby asks etcd who leads.
const leaderLookupEvery = time.Second

// leader returns the leader's address and term as last read from etcd (at most
// leaderLookupEvery old), or this replica's own when it leads.
func (s *Service) leader(ctx context.Context) (string, int64) {
	now := s.cfg.Clock.Now()
	s.mu.Lock()
	if s.core != nil || (!s.leaderAt.IsZero() && now.Sub(s.leaderAt) < leaderLookupEvery) {
		defer s.mu.Unlock()
		return s.leaderAddr, s.leaderRev
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	addr, rev, err := contract.Leader(ctx, s.cfg.Etcd, s.cfg.ElectionPrefix)
	if errors.Is(err, contract.ErrNoLeader) {
		err = nil // an empty election is an answer: nobody leads
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		s.leaderAddr, s.leaderRev, s.leaderAt = addr, rev, now
	}
	return s.leaderAddr, s.leaderRev
}

// Report is allot.v1.Balancer/Report: the leader ingests, a standby redirects. It is a
// span (tracing.SpanBalancerReport), a child of the enforcer's report span when the RPC
// carries its trace context, whose result is the metric's (accepted, redirected, invalid,
// forbidden).
func (s *Service) Report(ctx context.Context, req *allotv1.ReportRequest) (*allotv1.ReportResponse, error) {
	ctx, span := s.tracer.Start(tracing.ExtractGRPC(ctx), tracing.SpanBalancerReport, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(tracing.AttrRegion.String(req.GetRegion()), tracing.AttrEnforcerID.String(req.GetEnforcerId()),
			tracing.AttrSeq.Int64(int64(req.GetSeq())), tracing.AttrIdentities.Int(len(req.GetUsage())),
			tracing.AttrEarly.Bool(req.GetEarly()), tracing.AttrAck.Bool(req.GetAck()), tracing.AttrFinal.Bool(req.GetFinal()),
			tracing.AttrShareVersion.Int64(int64(req.GetShareVersion()))))
	defer span.End()
	resp, result, err := s.report(ctx, req)
	s.m.reports.WithLabelValues(s.regionLabel(req.GetRegion()), result).Inc()
	span.SetAttributes(tracing.AttrResult.String(result))
	if err != nil {
		span.SetStatus(otelcodes.Error, err.Error())
	} else if result == "accepted" {
		span.SetAttributes(tracing.AttrTerm.Int64(resp.GetLeaderRev()))
	}
	return resp, err
}

func (s *Service) report(ctx context.Context, req *allotv1.ReportRequest) (_ *allotv1.ReportResponse, result string, _ error) {
	region := s.regionLabel(req.GetRegion())
	if s.cfg.RegionFromPeer {
		if err := peerMayReport(ctx, req.GetRegion()); err != nil {
			return nil, "forbidden", err
		}
	}
	s.mu.Lock()
	core, rev := s.core, s.rev
	s.mu.Unlock()
	if core == nil {
		addr, lrev := s.leader(ctx)
		return &allotv1.ReportResponse{Accepted: false, LeaderAddr: addr, LeaderRev: lrev}, "redirected", nil
	}
	now := s.cfg.Clock.Now()
	if err := core.Ingest(now, req); err != nil {
		code := codes.InvalidArgument
		if errors.Is(err, ErrTooManyEnforcers) {
			code = codes.ResourceExhausted
		}
		return nil, "invalid", status.Error(code, err.Error())
	}
	s.m.observeLag(region, now.Sub(time.UnixMilli(req.GetIntervalEndMs())))
	if AsksForTick(req) {
		// A shift, or an acknowledgement a change plan may be waiting for: tick now, not at
		// the next TickEvery (a move costs one acknowledged round trip, not ticks). The
		// tick's spans link to this report's.
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			s.mu.Lock()
			s.kickedBy = sc
			s.mu.Unlock()
		}
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	resp := &allotv1.ReportResponse{Accepted: true, LeaderAddr: s.cfg.Advertise, LeaderRev: rev}
	resp.ShareLeaderRev, resp.ShareVersion = core.Newest()
	core.Quotas(now, req, resp)
	return resp, "accepted", nil
}

// AsksForTick says whether report r makes the leader tick at once (the Service's kick)
// rather than at the next TickEvery: early (a shift), an acknowledgement a change plan may
// be waiting for, or final.
func AsksForTick(r *allotv1.ReportRequest) bool { return r.GetEarly() || r.GetAck() || r.GetFinal() }

// peerMayReport refuses a report for region unless the connection's verified client
// certificate names that region (certs.PeerMayReport).
func peerMayReport(ctx context.Context, region string) error {
	return certs.PeerMayReport(ctx, "balancer", region)
}

func (s *Service) regionLabel(r string) string {
	for _, name := range s.cfg.Core.Regions {
		if r == name {
			return name
		}
	}
	return "unknown"
}
