package report

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/routine"
	"github.com/allot-dev/allot/pkg/tracing"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// ReporterConfig configures a Reporter. Start from DefaultReporterConfig and set the
// required fields (Table, Region, EnforcerID, Leader, Registerer).
type ReporterConfig struct {
	// Table is drained every Table.Interval(), or early when Table.WantEarly. Required.
	Table *Table
	// Region and EnforcerID fill every report. Required.
	Region     string
	EnforcerID string
	// Leader names the balancer leader's report address; EtcdLeader in production.
	// Asked when no leader is cached: at the first report and after a failed attempt.
	// Required unless Addrs is set (and then it must be nil).
	Leader LeaderSource
	// Addrs, if not empty, are the balancer replicas' report addresses as this enforcer
	// reaches them ("host:port" each, e.g. through the region's own proxy or load
	// balancer), used instead of Leader. Each attempt starts at the address that last
	// accepted a report (the first one before any) and goes round the list once: on an
	// error or a non-leader answer it tries the next address, or the one a standby
	// redirects to if that address is in the list and not tried yet. A redirect to an
	// address not in the list is not followed (it names the leader as the balancer
	// advertises it, which this region may not reach); MaxRedirects does not apply.
	Addrs []string
	// Shares returns the share set this enforcer applies (the leader revision and version
	// of pkg/contract.Head), read once per report. nil reports 0, 0.
	Shares func() (leaderRev int64, version uint64)
	// SharesChanged, if not nil, receives when the enforcer swaps in a new share set
	// (overrides.Holder.Changed). The Reporter then reports early — at least AckGap after the
	// last report — so the balancer sees the new version applied (the acknowledgement its
	// change plan waits for before it publishes increases) within about AckGap, not a
	// whole interval.
	SharesChanged <-chan struct{}
	// Accepted, if not nil, is told when the leader accepted a report (with the time the
	// answer came): overrides.Holder.Heard, so an enforcer the balancer has not heard from
	// for the staleness period falls back to min(last, default) exactly when the
	// balancer starts treating its region so.
	// It is told the accepted report's seq (a cut-off enforcer rejoins once it hears of
	// one later than its mark: pkg/enforcer/node) and the newest share set the leader had
	// made.
	Accepted func(Acceptance)
	// Fences, if not nil, is called once per report (before it is sent, whether or not it
	// can be) and returns how many of the region's enforcers are marked fenced in its
	// store and the newest marks (ReportRequest.fenced_seen, fence_marks); the node's
	// hook also marks this enforcer while it is fenced (pkg/bucket.Fences). It must return
	// within its ctx (250 ms at most, SendTimeout if shorter). seq is the report's: every
	// report of this Reporter with a lower seq was sent before the call, every one with a
	// higher seq will be sent after it (a cut-off enforcer's mark names seq-1).
	Fences func(ctx context.Context, now time.Time, seq uint64) Fenced
	// AckGap is the least time between reports that an acknowledgement may bring forward.
	// Must be > 0. Default 250ms.
	AckGap time.Duration
	// Clock paces the reports; nil means clock.Real().
	Clock clock.Clock
	// Logger gets send failures and drops; nil means hclog.NewNullLogger().
	Logger hclog.Logger
	// Registerer is where the Reporter's metrics go; never the global one. Required.
	Registerer prometheus.Registerer
	// SendTimeout bounds each RPC and each leader lookup. Must be > 0. Default 2s.
	SendTimeout time.Duration
	// MaxRedirects is how many standby redirects one attempt follows, in [0, 5].
	// Default 2.
	MaxRedirects int
	// TLS, if not nil, is the gRPC client's TLS (CA, client certificate); nil means
	// plaintext.
	TLS *tls.Config
	// Tracer, if not nil, makes each report a span (tracing.SpanReport: region, enforcer,
	// seq, identities, flags, attempts, result) whose trace context goes with the report
	// RPC, so the balancer's span of it is a child; nil: no spans and no trace context
	// sent.
	Tracer trace.Tracer
	// DialOptions are added to every connection the Reporter makes to a balancer, after
	// its transport credentials: e.g. an interceptor that times each Report call (the
	// scale benchmark's). nil adds none.
	DialOptions []grpc.DialOption
	// Quotas, if not nil, gives the region's calendar quota counts each report carries (at
	// most MaxQuotas), and QuotaView, if not nil, takes the leader's answers: the other
	// regions' counts (quota.go). nil: no quotas reported.
	Quotas    QuotaCounter
	QuotaView *QuotaView
	// MaxQuotas caps the quota counts of one report (the balancer refuses a report with
	// more than its MaxEntries). Default 10,000.
	MaxQuotas int
}

// Acceptance is what the Accepted hook is told of an accepted report.
type Acceptance struct {
	At time.Time // when the leader heard it (for a relayed report, as the aggregator said)
	// Seq is the report the leader heard then: this one; for a relayed report the one the
	// leader last confirmed (ReportResponse.heard_seq).
	Seq uint64
	// LeaderRev and Version: the newest share set the leader had made when it took the
	// report Seq names (ReportResponse.share_leader_rev, share_version; 0 and 0 when not
	// said).
	LeaderRev int64
	Version   uint64
}

// Fenced is what the Fences hook read of its region's fenced enforcers.
type Fenced struct {
	Seen  uint32               // ReportRequest.fenced_seen
	Marks []*allotv1.FenceMark // ReportRequest.fence_marks
}

// fencesTimeout bounds the Fences hook's store call (one script, normally under a
// millisecond): a store that hangs delays a report, and so an acknowledgement, by at most
// this much.
const fencesTimeout = 250 * time.Millisecond

// DefaultReporterConfig returns the defaults described on each ReporterConfig field.
func DefaultReporterConfig() ReporterConfig {
	return ReporterConfig{SendTimeout: 2 * time.Second, MaxRedirects: 2, AckGap: 250 * time.Millisecond, MaxQuotas: 10_000}
}

// Validate reports the first bad field, naming it and its value.
func (c ReporterConfig) Validate() error {
	switch {
	case c.Table == nil:
		return fmt.Errorf("%w: Table is nil", ErrConfig)
	case c.Region == "":
		return fmt.Errorf("%w: Region is empty", ErrConfig)
	case c.EnforcerID == "":
		return fmt.Errorf("%w: EnforcerID is empty", ErrConfig)
	case c.Leader == nil && len(c.Addrs) == 0:
		return fmt.Errorf("%w: Leader is nil and Addrs is empty: one says where the balancer is", ErrConfig)
	case c.Leader != nil && len(c.Addrs) > 0:
		return fmt.Errorf("%w: Leader and Addrs are both set: use one", ErrConfig)
	case c.Registerer == nil:
		return fmt.Errorf("%w: Registerer is nil", ErrConfig)
	case c.SendTimeout <= 0:
		return fmt.Errorf("%w: SendTimeout %v, must be > 0", ErrConfig, c.SendTimeout)
	case c.AckGap <= 0:
		return fmt.Errorf("%w: AckGap %v, must be > 0", ErrConfig, c.AckGap)
	case c.MaxRedirects < 0 || c.MaxRedirects > 5:
		return fmt.Errorf("%w: MaxRedirects %d, must be in [0, 5]", ErrConfig, c.MaxRedirects)
	case c.Quotas != nil && c.MaxQuotas <= 0:
		return fmt.Errorf("%w: MaxQuotas %d, must be > 0 with Quotas", ErrConfig, c.MaxQuotas)
	}
	for i, a := range c.Addrs {
		if err := CheckAddr(a); err != nil {
			return fmt.Errorf("%w: Addrs[%d]: %v", ErrConfig, i, err)
		}
	}
	return nil
}

// Reporter owns one goroutine that drains its Table every interval (or early) and sends
// the report to the balancer leader. A report is tried at most twice (the retry with the
// same seq, after re-resolving the leader) and then dropped; nothing is queued, so a
// leader that is down costs memory for one report at most and the check path nothing.
//
// seq starts at the Unix milliseconds of NewReporter's clock reading and grows by one per
// report (a retry repeats it), so a restarted process with the same EnforcerID continues
// above its predecessor's numbers. Every interval gets a report, one with no usage too: it
// tells the balancer the region is alive and which share version it applies (the
// acknowledgement the balancer's change plan waits for). Close stops the goroutine and
// waits; it is idempotent and safe to call from any goroutine. The zero Reporter is not
// usable: build it with NewReporter.
type Reporter struct {
	cfg    ReporterConfig
	clock  clock.Clock
	log    hclog.Logger
	m      *metrics
	creds  grpc.DialOption
	tracer trace.Tracer // cfg.Tracer, or a no-op one

	// Owned by the goroutine (and by Close once it has exited).
	seq      uint64
	addr     string    // the cached leader address; "" means ask Leader
	ring     *AddrRing // Addrs' rotation; nil without Addrs
	conn     *grpc.ClientConn
	connAddr string

	ctx context.Context // the goroutine's (cancelled by Close: aborts an RPC in flight)

	loop routine.Routine
	once sync.Once // the first of Close and Leave decides
	err  error     // Close's result
}

// NewReporter validates cfg, registers the metrics and starts the reporting goroutine.
func NewReporter(cfg ReporterConfig) (*Reporter, error) {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real()
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	r := &Reporter{cfg: cfg, clock: cfg.Clock, log: cfg.Logger, m: m,
		seq: uint64(cfg.Clock.Now().UnixMilli()), tracer: cfg.Tracer}
	if r.tracer == nil {
		r.tracer = noop.NewTracerProvider().Tracer("")
	}
	r.creds = grpc.WithTransportCredentials(insecure.NewCredentials())
	if cfg.TLS != nil {
		r.creds = grpc.WithTransportCredentials(credentials.NewTLS(cfg.TLS))
	}
	if len(cfg.Addrs) > 0 {
		r.ring = NewAddrRing(cfg.Addrs)
	}
	if err := r.loop.Start(r.run); err != nil {
		return nil, err
	}
	return r, nil
}

// Close stops the goroutine (aborting a send in flight), waits for it and closes the
// connection. Safe to call more than once; the first of Close and Leave decides.
func (r *Reporter) Close() error { return r.close(false) }

// Leave is Close for an enforcer that has stopped answering checks (a graceful shutdown,
// after the drain): it also sends one last report, flagged final, with what the table
// counted since the last one, so the balancer stops holding this enforcer's share for it
// (a silent enforcer is held until it has fenced itself by its own staleness rule, about
// five minutes). The report gets one attempt within SendTimeout; a failure is logged and
// costs only that wait on the balancer's side. Bounded by SendTimeout.
func (r *Reporter) Leave() error { return r.close(true) }

func (r *Reporter) close(final bool) error {
	r.once.Do(func() {
		r.loop.Close()
		if final { // the goroutine has exited: its fields are ours now
			ctx, cancel := context.WithTimeout(context.Background(), r.cfg.SendTimeout)
			r.ctx = ctx
			r.leave()
			cancel()
		}
		if r.conn != nil {
			r.err = r.conn.Close()
		}
	})
	return r.err
}

// leave sends the final report: one attempt.
func (r *Reporter) leave() {
	now := r.clock.Now()
	req := r.cfg.Table.Report(now)
	r.seq++
	req.Region, req.EnforcerId, req.Seq, req.Final = r.cfg.Region, r.cfg.EnforcerID, r.seq, true
	if r.cfg.Shares != nil {
		req.ShareLeaderRev, req.ShareVersion = r.cfg.Shares()
	}
	if r.cfg.Quotas != nil {
		req.Quotas = r.cfg.Quotas.QuotaCounts(now, r.cfg.MaxQuotas)
	}
	ctx, span := r.startSpan(req)
	defer span.End()
	if _, err := r.send(ctx, req); err != nil {
		r.m.failures.Inc()
		endSpan(span, 1, err)
		r.log.Warn("final usage report not delivered; the balancer holds this enforcer's share until its staleness period passes", "seq", req.Seq, "error", err)
		return
	}
	endSpan(span, 1, nil)
	r.m.sent.Inc()
}

// run follows the Schedule (see it for the cadence): it reports when the schedule says
// so and otherwise sleeps on the clock until the schedule's Wake, a jump in the table's
// refusals (Table.Early) or a new share set (SharesChanged), and asks again.
func (r *Reporter) run(ctx context.Context) {
	r.ctx = ctx
	t := r.cfg.Table
	s := NewSchedule(t.Config(), r.cfg.AckGap, t.Start())
	for {
		now := r.clock.Now()
		step := s.At(now, t.Start(), t.Jumped())
		if step.Report {
			r.report(now, step.Early, step.Ack)
			s.Reported(now)
			if ctx.Err() != nil {
				return
			}
			continue
		}
		tm := r.clock.NewTimer(step.Wake.Sub(now))
		select {
		case <-tm.C():
		case <-r.cfg.SharesChanged:
			s.SharesChanged()
		case <-t.Early():
		case <-ctx.Done():
			tm.Stop()
			return
		}
		tm.Stop()
	}
}

// report drains the table at now and sends the report: one attempt, one retry, or drop.
// early: refusals jumped; ack: sent early to acknowledge a new share set.
func (r *Reporter) report(now time.Time, early, ack bool) {
	req := r.cfg.Table.Report(now)
	r.seq++
	req.Region, req.EnforcerId, req.Seq, req.Early, req.Ack = r.cfg.Region, r.cfg.EnforcerID, r.seq, early, ack
	if r.cfg.Shares != nil {
		req.ShareLeaderRev, req.ShareVersion = r.cfg.Shares()
	}
	if r.cfg.Quotas != nil {
		req.Quotas = r.cfg.Quotas.QuotaCounts(now, r.cfg.MaxQuotas)
	}
	if r.cfg.Fences != nil {
		fctx, cancel := context.WithTimeout(r.ctx, min(r.cfg.SendTimeout, fencesTimeout))
		f := r.cfg.Fences(fctx, now, req.Seq)
		req.FencedSeen, req.FenceMarks = f.Seen, f.Marks
		cancel()
		r.m.fencedSeen.Set(float64(req.FencedSeen))
	}
	if early {
		r.m.early.Inc()
	}
	r.m.identities.Observe(float64(len(req.Usage)))
	r.m.omittedIDs.Add(float64(req.OmittedIdentities))
	r.m.omittedTokens.Add(req.OmittedTokens)

	ctx, span := r.startSpan(req)
	defer span.End()
	var err error
	for try := 0; try < 2; try++ {
		var resp *allotv1.ReportResponse
		if resp, err = r.send(ctx, req); err == nil {
			endSpan(span, try+1, nil)
			at := r.clock.Now()
			if r.cfg.QuotaView != nil {
				r.cfg.QuotaView.Answered(at, req.Quotas, resp)
			}
			if r.cfg.Accepted != nil {
				if a, ok := AcceptanceOf(at, req.Seq, resp); ok {
					r.cfg.Accepted(a)
				}
			}
			r.m.sent.Inc()
			r.m.lag.Set(at.Sub(now).Seconds())
			r.m.lastSent.Set(float64(at.UnixNano()) / 1e9)
			return
		}
		r.m.failures.Inc()
		span.AddEvent("attempt failed", trace.WithAttributes(attribute.String("error", err.Error())))
		// Ask the LeaderSource again, and reconnect: a connection that failed may sit in
		// gRPC's reconnect backoff (up to minutes) after the leader is back.
		r.addr = ""
		r.closeConn()
		if r.ctx.Err() != nil || status.Code(err) == codes.InvalidArgument {
			endSpan(span, try+1, err)
			break // closing, or the same report would be rejected again
		}
		if try == 1 {
			endSpan(span, 2, err)
		}
		r.log.Debug("usage report failed", "seq", req.Seq, "try", try+1, "error", err)
	}
	r.m.dropped.Inc()
	if r.ctx.Err() == nil {
		r.log.Warn("usage report dropped", "seq", req.Seq, "identities", len(req.Usage), "error", err)
	}
}

// heardAt is when an accepted answer says the leader last heard this enforcer: at, the
// answer's time, from the leader itself; through a region aggregator (resp.relayed), the
// moment the leader last confirmed hearing it (heard_ago_ms before at), or none yet. The
// staleness rule counts from it, so an enforcer behind an aggregator that cannot reach
// the leader fences itself as one that cannot reach the leader does.
func heardAt(at time.Time, resp *allotv1.ReportResponse) (time.Time, bool) {
	if !resp.GetRelayed() {
		return at, true
	}
	ago := resp.GetHeardAgoMs()
	if ago < 0 {
		return time.Time{}, false
	}
	return at.Add(-time.Duration(ago) * time.Millisecond), true
}

// AcceptanceOf is what an accepted answer at at to report seq tells the Accepted hook:
// from the leader, that it heard this report then; relayed by an aggregator, that it last
// confirmed hearing report heard_seq (heardAt), which took this one. None before the
// leader confirmed any. An aggregator that says no heard_seq (an older one, which
// forwards no marks either) is read as before: this report.
func AcceptanceOf(at time.Time, seq uint64, resp *allotv1.ReportResponse) (Acceptance, bool) {
	heard, ok := heardAt(at, resp)
	if !ok {
		return Acceptance{}, false
	}
	a := Acceptance{At: heard, Seq: seq, LeaderRev: resp.GetShareLeaderRev(), Version: resp.GetShareVersion()}
	if resp.GetRelayed() && resp.GetHeardSeq() != 0 {
		a.Seq = resp.GetHeardSeq()
	}
	return a, true
}

var (
	errStandby   = errors.New("usage: balancer standby knows no leader")
	errRedirects = errors.New("usage: too many balancer redirects")
	errNotLeader = errors.New("usage: balancer replica is not the leader")
)

// send makes one attempt: to the cached leader (or the one Leader names), following at
// most MaxRedirects standby redirects; with Addrs, once round the list (sendList). parent
// is the report's context (r.ctx with the report's span): each RPC carries its trace
// context.
func (r *Reporter) send(parent context.Context, req *allotv1.ReportRequest) (*allotv1.ReportResponse, error) {
	if r.ring != nil {
		return r.sendList(parent, req)
	}
	addr := r.addr
	if addr == "" {
		ctx, cancel := context.WithTimeout(parent, r.cfg.SendTimeout)
		a, err := r.cfg.Leader.Leader(ctx)
		cancel()
		if err != nil {
			return nil, err
		}
		addr = a
	}
	for redirects := 0; ; redirects++ {
		cc, err := r.dial(addr)
		if err != nil {
			return nil, err
		}
		ctx, cancel := context.WithTimeout(tracing.InjectGRPC(parent), r.cfg.SendTimeout)
		resp, err := allotv1.NewBalancerClient(cc).Report(ctx, req)
		cancel()
		switch {
		case err != nil:
			return nil, fmt.Errorf("while reporting to %s: %w", addr, err)
		case resp.GetAccepted():
			r.addr = addr
			return resp, nil
		case resp.GetLeaderAddr() == "" || resp.GetLeaderAddr() == addr:
			return nil, fmt.Errorf("%w (asked %s)", errStandby, addr)
		case redirects == r.cfg.MaxRedirects:
			return nil, fmt.Errorf("%w: %d followed, %s points at %s", errRedirects, redirects, addr, resp.GetLeaderAddr())
		}
		r.m.redirects.Inc()
		addr = resp.GetLeaderAddr()
	}
}

// sendList makes one attempt over Addrs (see ReporterConfig.Addrs): every address at
// most once, from the one that last accepted. The error joins every address's.
func (r *Reporter) sendList(parent context.Context, req *allotv1.ReportRequest) (*allotv1.ReportResponse, error) {
	var errs []error
	p := r.ring.Pass()
	for addr, ok := p.Addr(); ok; addr, ok = p.Addr() {
		resp, redirect, err := r.sendOnce(parent, addr, req)
		if err == nil {
			p.Accepted()
			return resp, nil
		}
		errs = append(errs, err)
		r.closeConn() // the next address, or a fresh connection for the retry
		if p.Failed(redirect) {
			r.m.redirects.Inc()
		} else if redirect != "" && redirect != addr {
			r.log.Debug("balancer redirect not followed: not one of balancer addrs", "from", addr, "to", redirect)
		}
		if r.ctx.Err() != nil || status.Code(err) == codes.InvalidArgument {
			break
		}
	}
	return nil, errors.Join(errs...)
}

// sendOnce sends req to addr: nil when accepted, else the error and, for a non-leader
// answer, the leader address it named ("" if none).
func (r *Reporter) sendOnce(parent context.Context, addr string, req *allotv1.ReportRequest) (_ *allotv1.ReportResponse, redirect string, err error) {
	cc, err := r.dial(addr)
	if err != nil {
		return nil, "", err
	}
	ctx, cancel := context.WithTimeout(tracing.InjectGRPC(parent), r.cfg.SendTimeout)
	resp, err := allotv1.NewBalancerClient(cc).Report(ctx, req)
	cancel()
	switch {
	case err != nil:
		return nil, "", fmt.Errorf("while reporting to %s: %w", addr, err)
	case resp.GetAccepted():
		return resp, "", nil
	case resp.GetLeaderAddr() == "":
		return nil, "", fmt.Errorf("%w (asked %s)", errStandby, addr)
	}
	return nil, resp.GetLeaderAddr(), fmt.Errorf("%w: %s answered as a standby (leader %s)", errNotLeader, addr, resp.GetLeaderAddr())
}

// startSpan starts req's span (tracing.SpanReport) under r.ctx.
func (r *Reporter) startSpan(req *allotv1.ReportRequest) (context.Context, trace.Span) {
	return r.tracer.Start(r.ctx, tracing.SpanReport, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(tracing.AttrRegion.String(req.Region), tracing.AttrEnforcerID.String(req.EnforcerId),
			tracing.AttrSeq.Int64(int64(req.Seq)), tracing.AttrIdentities.Int(len(req.Usage)),
			tracing.AttrEarly.Bool(req.Early), tracing.AttrAck.Bool(req.Ack), tracing.AttrFinal.Bool(req.Final),
			tracing.AttrShareVersion.Int64(int64(req.ShareVersion))))
}

// endSpan records a report's outcome on its span: "sent", or "dropped" with the error.
func endSpan(span trace.Span, attempts int, err error) {
	result := "sent"
	if err != nil {
		result = "dropped"
		span.SetStatus(otelcodes.Error, err.Error())
	}
	span.SetAttributes(tracing.AttrAttempts.Int(attempts), tracing.AttrResult.String(result))
}

// dial returns a connection to addr, replacing (and closing) the one to another address.
// grpc.NewClient does not connect; the RPC does, within its timeout.
func (r *Reporter) dial(addr string) (*grpc.ClientConn, error) {
	if r.conn != nil && r.connAddr == addr {
		return r.conn, nil
	}
	r.closeConn()
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{r.creds}, r.cfg.DialOptions...)...)
	if err != nil {
		return nil, fmt.Errorf("while dialling balancer %s: %w", addr, err)
	}
	r.conn, r.connAddr = cc, addr
	return cc, nil
}

func (r *Reporter) closeConn() {
	if r.conn != nil {
		_ = r.conn.Close()
		r.conn, r.connAddr = nil, ""
	}
}
