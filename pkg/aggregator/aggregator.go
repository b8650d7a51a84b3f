// Package aggregator is the report aggregation tier (issue 26 §3, docs/design.md §12):
// per region, an elected aggregator takes its enforcers' usage reports
// (allot.v1.Balancer/Report, the same API the balancer serves), merges them, and forwards
// one report per interval to the balancer leader — and at once whatever a change plan
// waits for (an acknowledgement of a new share version, an early report, a final one).
// It is optional: an enforcer reports through it only with balancer.via_aggregator.
//
// What it keeps of the direct path:
//   - Acknowledgements and silence per enforcer: every forward lists each enforcer heard
//     (ReportRequest.members: its applied set, how long ago it was heard, final), which the
//     leader records as if it had reported itself; a decrease is still acknowledged by
//     every enforcer, a silent one is still held until it fenced itself.
//   - Fencing: an enforcer counts itself heard (its staleness rule) only as of the last
//     moment the leader confirmed hearing it (ReportResponse.relayed, heard_ago_ms), never
//     as of the aggregator's answer: an aggregator that cannot reach the leader leaves its
//     enforcers to fence themselves exactly as a leader they cannot reach does.
//   - Validation: the same checks as the leader's; with RegionFromPeer a report is
//     believed only for the region its client certificate names, and only this
//     aggregator's region.
//   - The merge keeps the heavy-hitter error bound (see merger) and is bounded.
//   - Quotas: the region's counts are forwarded (the largest of each); the leader's last
//     answer is returned to the enforcers, its hold time shortened by the answer's age so
//     an enforcer holds its region when the leader starts counting it silent.
//   - Fenced enforcers: a forward says the largest fenced_seen its members said since the
//     last one (they all count the same store's marks), so the leader keeps the region's
//     default share reserved for an enforcer cut off for long as it does directly, and
//     the marks of the member report received last, with their age
//     (fence_marks_ago_ms) and each member's highest seq (Member.seq), so the leader
//     releases an enforcer cut off alone on its mark as it does directly. The enforcer is
//     told which of its reports the leader confirmed (heard_seq) and the newest set the
//     leader had made then: it marks itself with the seq of the last report it sent, and
//     rejoins once a later one is confirmed and it applies that set.
//
// Which way it errs: later, never over on shares — usage reaches the leader up to one
// interval later than directly; a quota new to the region is answered one forward later,
// and near a quota's exhaustion the other regions' counts are up to an interval older
// (over, by the other regions' rates × that interval, once a period).
//
// Share sets are not fanned out: enforcers keep watching etcd directly (bench-scale showed
// report latency, not etcd watch fan-out, is one leader's limit).
package aggregator

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/allot-dev/allot/pkg/certs"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/enforcer/report"
	"github.com/allot-dev/allot/pkg/routine"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// ErrClosed is returned by Start after Close.
var ErrClosed = errors.New("aggregator: closed")

// Config configures an Aggregator. Start from DefaultConfig.
type Config struct {
	// Region whose enforcers' reports it merges. Required.
	Region string
	// ID is its enforcer_id upstream (deduplication of its forwards). Required.
	ID string
	// Advertise is its report address ("host:port"), the value it campaigns with: what the
	// region's enforcers resolve and a standby aggregator redirects to. Required.
	Advertise string
	// Etcd, if not nil, is the client of the election: the region's aggregators elect one
	// on ElectionPrefix, and only it merges; nil: this one always serves (one aggregator,
	// tests). Not closed by the Aggregator.
	Etcd *clientv3.Client
	// ElectionPrefix: default contract.AggregatorElection(contract.AggregatorPrefix, Region).
	ElectionPrefix string
	// SessionTTL is the election lease, whole seconds >= 1s. Default 10s.
	SessionTTL time.Duration
	// Upstream names the balancer leader (report.EtcdLeader in production). Required
	// unless Addrs is set.
	Upstream report.LeaderSource
	// Addrs, if set, are the balancer replicas' report addresses as this region reaches
	// them (through its own links, a proxy): Upstream is not asked, and each forward goes
	// round the list once from the one that last accepted, following a standby's redirect
	// only to an address of the list (report.AddrRing, as the enforcers' ReporterConfig.Addrs).
	Addrs []string
	// TLS, if not nil, is the upstream client's (the region's report certificate);
	// nil means plaintext. DialOptions are added to every dial.
	TLS         *tls.Config
	DialOptions []grpc.DialOption
	// Interval between forwards (the enforcers'). Default 10s.
	Interval time.Duration
	// AckGap is the least time between forwards an acknowledgement, early or final report
	// brings forward. Default 250ms.
	AckGap time.Duration
	// SendTimeout bounds each upstream RPC and leader lookup. Default 2s.
	SendTimeout time.Duration
	// MaxEntries caps a forward's usage entries and an enforcer's report (keep it at most
	// the balancer's MaxEntries); MaxQuotas a forward's quota counts; MaxMembers the
	// enforcers behind it (at most the balancer's MaxEnforcers). Defaults 4096, 4096, 4096.
	MaxEntries, MaxQuotas, MaxMembers int
	// Forget drops an enforcer not heard for this long from the forwards (the leader holds
	// it as silent from its last word). Default 10m (past the default Stale + AckTimeout).
	Forget time.Duration
	// RegionFromPeer: take a report only over mutual TLS whose client certificate names
	// its region (as the balancer's ServiceConfig.RegionFromPeer).
	RegionFromPeer bool
	// Clock, Logger, Registerer: defaults the wall clock, a null logger, a new registry.
	Clock      clock.Clock
	Logger     hclog.Logger
	Registerer prometheus.Registerer
}

// DefaultConfig returns the defaults above.
func DefaultConfig() Config {
	return Config{SessionTTL: 10 * time.Second, Interval: 10 * time.Second, AckGap: 250 * time.Millisecond,
		SendTimeout: 2 * time.Second, MaxEntries: 4096, MaxQuotas: 4096, MaxMembers: 4096, Forget: 10 * time.Minute}
}

// Validate names the bad fields and values.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("aggregator: Config."+format, a...)) }
	if c.Region == "" {
		bad("Region is empty")
	}
	if c.ID == "" {
		bad("ID is empty")
	}
	if c.Advertise == "" {
		bad("Advertise is empty: standbys would have no address to redirect to")
	}
	if c.Upstream == nil && len(c.Addrs) == 0 {
		bad("Upstream is nil and Addrs empty: no way to find the balancer leader")
	}
	for i, a := range c.Addrs {
		if err := report.CheckAddr(a); err != nil {
			bad("Addrs[%d]: %v", i, err)
		}
	}
	if c.Etcd != nil && (c.SessionTTL < time.Second || c.SessionTTL%time.Second != 0) {
		bad("SessionTTL %v, must be whole seconds >= 1s", c.SessionTTL)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"Interval", c.Interval}, {"AckGap", c.AckGap}, {"SendTimeout", c.SendTimeout}, {"Forget", c.Forget}} {
		if d.v <= 0 {
			bad("%s %v, must be > 0", d.name, d.v)
		}
	}
	if c.AckGap > c.Interval {
		bad("AckGap %v, must be <= Interval %v", c.AckGap, c.Interval)
	}
	for _, n := range []struct {
		name string
		v    int
	}{{"MaxEntries", c.MaxEntries}, {"MaxQuotas", c.MaxQuotas}, {"MaxMembers", c.MaxMembers}} {
		if n.v < 1 {
			bad("%s %d, must be >= 1", n.name, n.v)
		}
	}
	return errors.Join(errs...)
}

// answer is the leader's last answer to a forward: what the enforcers are told.
type answer struct {
	at       time.Time // when it came (zero: none yet)
	rev      int64
	answered bool
	fraction float64
	holdMs   int64
	others   map[quotaKey]int64
}

// Aggregator is one region aggregator replica. Safe for concurrent use; Close is
// idempotent, bounded and waits for every goroutine it started.
type Aggregator struct {
	allotv1.UnimplementedBalancerServer

	cfg  Config
	log  hclog.Logger
	clk  clock.Clock
	m    *metrics
	kick chan struct{} // cap 1: forward at once (at least AckGap after the last)

	mu       sync.Mutex // mu guards the fields below
	merge    *merger
	elected  bool
	standby  string    // the elected one's address, as last read
	lookedAt time.Time // when standby was read
	ans      answer
	seq      uint64

	// The upstream connection; only the forward loop uses it.
	conn     *grpc.ClientConn
	connAddr string
	addr     string           // the leader that last accepted ("" : ask Upstream)
	ring     *report.AddrRing // Addrs' rotation; nil without Addrs
	creds    grpc.DialOption

	loop, campaign routine.Routine
	cleanup        context.Context // outlives the loops by at most SendTimeout from Close
	stopCleanup    context.CancelFunc
	elect          *clientv3.Client // Etcd seen with Ctx() = cleanup (see balancer.Service)
}

// New validates cfg and registers the metrics; Start starts it.
func New(cfg Config) (*Aggregator, error) {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real()
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	if cfg.ElectionPrefix == "" {
		cfg.ElectionPrefix = contract.AggregatorElection(contract.AggregatorPrefix, cfg.Region)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	a := &Aggregator{cfg: cfg, log: cfg.Logger, clk: cfg.Clock, m: m, kick: make(chan struct{}, 1),
		seq: uint64(cfg.Clock.Now().UnixMilli()), elected: cfg.Etcd == nil}
	a.merge = newMerger(cfg.Region, cfg.MaxEntries, cfg.MaxQuotas, cfg.MaxMembers, cfg.Interval, cfg.Clock.Now())
	if len(cfg.Addrs) > 0 {
		a.ring = report.NewAddrRing(cfg.Addrs)
	}
	a.creds = grpc.WithTransportCredentials(insecure.NewCredentials())
	if cfg.TLS != nil {
		a.creds = grpc.WithTransportCredentials(credentials.NewTLS(cfg.TLS))
	}
	a.cleanup, a.stopCleanup = context.WithCancel(context.Background())
	if cfg.Etcd != nil {
		a.elect = clientv3.NewCtxClient(a.cleanup, clientv3.WithZapLogger(cfg.Etcd.GetLogger()))
		a.elect.KV, a.elect.Lease, a.elect.Watcher = cfg.Etcd.KV, cfg.Etcd.Lease, cfg.Etcd.Watcher
	}
	return a, nil
}

// Start begins forwarding (and campaigning, with Etcd).
func (a *Aggregator) Start() error {
	if err := a.loop.Start(a.forwardLoop); errors.Is(err, routine.ErrClosed) {
		return ErrClosed
	}
	if a.cfg.Etcd != nil {
		if err := a.campaign.Start(a.campaignLoop); errors.Is(err, routine.ErrClosed) {
			return ErrClosed
		}
	}
	return nil
}

// Close stops both loops (resigning, so a standby takes over at once) and waits; the
// resignation is bounded by SendTimeout whether etcd answers or not. Idempotent.
func (a *Aggregator) Close() error {
	bound := time.AfterFunc(a.cfg.SendTimeout, a.stopCleanup)
	defer bound.Stop()
	a.campaign.Close()
	a.loop.Close()
	a.stopCleanup()
	a.mu.Lock()
	if a.conn != nil {
		_ = a.conn.Close()
		a.conn = nil
	}
	a.mu.Unlock()
	return nil
}

// Elected reports whether this replica serves its region now.
func (a *Aggregator) Elected() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.elected
}

// Members is how many enforcers this aggregator forwards for.
func (a *Aggregator) Members() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.merge.members)
}

// Report is allot.v1.Balancer/Report for the region's enforcers: the elected aggregator
// merges the report and answers with the leader's last quota answer and when the leader
// last confirmed hearing this enforcer; a standby redirects to the elected one.
func (a *Aggregator) Report(ctx context.Context, req *allotv1.ReportRequest) (*allotv1.ReportResponse, error) {
	resp, result, err := a.report(ctx, req)
	a.m.reports.WithLabelValues(result).Inc()
	return resp, err
}

func (a *Aggregator) report(ctx context.Context, req *allotv1.ReportRequest) (*allotv1.ReportResponse, string, error) {
	if a.cfg.RegionFromPeer {
		if err := peerMayReport(ctx, req.GetRegion()); err != nil {
			return nil, "forbidden", err
		}
	}
	now := a.clk.Now()
	a.mu.Lock()
	if !a.elected {
		a.mu.Unlock()
		return &allotv1.ReportResponse{Accepted: false, LeaderAddr: a.electedAddr(ctx)}, "redirected", nil
	}
	m, dup, urgent, err := a.merge.add(now, req)
	if err != nil {
		a.mu.Unlock()
		code := codes.InvalidArgument
		if errors.Is(err, ErrTooManyMembers) {
			code = codes.ResourceExhausted
		}
		return nil, "invalid", status.Error(code, err.Error())
	}
	resp := &allotv1.ReportResponse{Accepted: true, LeaderAddr: a.cfg.Advertise, LeaderRev: a.ans.rev}
	m.relay(now, resp)
	a.answerQuotas(now, req, resp)
	a.mu.Unlock()
	if urgent && !dup {
		select {
		case a.kick <- struct{}{}:
		default:
		}
	}
	if dup {
		return resp, "duplicate", nil
	}
	return resp, "accepted", nil
}

// answerQuotas fills resp's quota answer from the leader's last answer: the others' count
// of each quota the report carries that it answered, and a hold time shortened by the
// answer's age (nothing once it is as old as the leader's hold time). Called with a.mu
// held.
func (a *Aggregator) answerQuotas(now time.Time, req *allotv1.ReportRequest, resp *allotv1.ReportResponse) {
	ans := &a.ans
	if ans.at.IsZero() || !ans.answered {
		return
	}
	left := ans.holdMs - now.Sub(ans.at).Milliseconds()
	if left <= 0 {
		return // the leader counts this region silent by now: the enforcer holds itself
	}
	resp.QuotaAnswered, resp.QuotaIsolatedFraction, resp.QuotaHoldAfterMs = true, ans.fraction, left
	for _, q := range req.GetQuotas() {
		if c, ok := ans.others[quotaKey{q.Rule, q.Limit, q.Identity, q.PeriodStartMs}]; ok {
			resp.QuotaOthers = append(resp.QuotaOthers, &allotv1.QuotaCount{Rule: q.Rule, Limit: q.Limit,
				Identity: q.Identity, PeriodStartMs: q.PeriodStartMs, Quota: q.Quota, Count: c})
		}
	}
}

// lookupEvery bounds how often a standby asks etcd who is elected.
const lookupEvery = time.Second

// electedAddr is the elected aggregator's address as last read (at most lookupEvery
// old). Called with a.mu not held.
func (a *Aggregator) electedAddr(ctx context.Context) string {
	now := a.clk.Now()
	a.mu.Lock()
	if !a.lookedAt.IsZero() && now.Sub(a.lookedAt) < lookupEvery {
		defer a.mu.Unlock()
		return a.standby
	}
	a.mu.Unlock()
	if a.cfg.Etcd == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.SendTimeout)
	defer cancel()
	addr, _, err := contract.Leader(ctx, a.cfg.Etcd, a.cfg.ElectionPrefix)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err == nil || errors.Is(err, contract.ErrNoLeader) {
		a.standby, a.lookedAt = addr, now
	}
	return a.standby
}

// forwardLoop forwards every Interval, and at most AckGap after the last forward when a
// report asked for one at once.
func (a *Aggregator) forwardLoop(ctx context.Context) {
	last := a.clk.Now()
	next := last.Add(a.cfg.Interval)
	for {
		t := a.clk.NewTimer(next.Sub(a.clk.Now()))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-a.kick:
			t.Stop()
			if soon := last.Add(a.cfg.AckGap); soon.Before(next) {
				next = soon
			}
			if a.clk.Now().Before(next) {
				continue
			}
		case <-t.C():
		}
		now := a.clk.Now()
		a.forward(ctx, now)
		last = now
		next = now.Add(a.cfg.Interval)
	}
}

// forward sends one merged report upstream (one attempt and one retry, as an enforcer's
// Reporter; a dropped forward loses that usage as a dropped report does, while the
// members stay listed for the next).
func (a *Aggregator) forward(ctx context.Context, now time.Time) {
	a.mu.Lock()
	if !a.elected {
		a.mu.Unlock()
		return
	}
	req := a.merge.flush(now, a.cfg.Forget)
	if req == nil {
		a.mu.Unlock()
		return
	}
	a.seq++
	req.EnforcerId, req.Seq = a.cfg.ID, a.seq
	a.mu.Unlock()
	var err error
	for try := 0; try < 2 && ctx.Err() == nil; try++ {
		var resp *allotv1.ReportResponse
		if resp, err = a.send(ctx, req); err == nil {
			a.accepted(req, resp, now)
			a.m.forwards.WithLabelValues("accepted").Inc()
			return
		}
		a.addr = ""
		a.closeConn()
		if status.Code(err) == codes.InvalidArgument {
			break
		}
	}
	a.m.forwards.WithLabelValues("dropped").Inc()
	if ctx.Err() == nil {
		a.log.Warn("aggregated report dropped", "seq", req.Seq, "members", len(req.Members), "identities", len(req.Usage), "error", err)
	}
}

// accepted records the leader's answer to req (sent at sent).
func (a *Aggregator) accepted(req *allotv1.ReportRequest, resp *allotv1.ReportResponse, sent time.Time) {
	at := a.clk.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.merge.confirm(req, sent, resp.GetShareLeaderRev(), resp.GetShareVersion())
	ans := &a.ans
	if ans.rev != resp.GetLeaderRev() || ans.others == nil {
		ans.others = map[quotaKey]int64{} // a new term's answers only
	}
	ans.rev, ans.at, ans.answered = resp.GetLeaderRev(), at, resp.GetQuotaAnswered()
	ans.fraction, ans.holdMs = resp.GetQuotaIsolatedFraction(), resp.GetQuotaHoldAfterMs()
	for _, o := range resp.GetQuotaOthers() {
		k := quotaKey{o.Rule, o.Limit, o.Identity, o.PeriodStartMs}
		if _, ok := ans.others[k]; !ok && len(ans.others) >= a.cfg.MaxQuotas {
			for old := range ans.others { // an earlier period's first
				if old.period < k.period {
					delete(ans.others, old)
				}
			}
			if len(ans.others) >= a.cfg.MaxQuotas {
				continue
			}
		}
		ans.others[k] = o.Count
	}
}

// campaignLoop campaigns for the region's aggregator election until Close; between
// terms it waits a little (doubling, at most 5s).
func (a *Aggregator) campaignLoop(ctx context.Context) {
	wait := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := a.term(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			wait = min(2*wait, 5*time.Second)
			a.log.Warn("aggregator term ended; campaigning again", "error", err, "retry-in", wait)
		} else {
			wait = 100 * time.Millisecond
		}
		t := a.clk.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// term campaigns, then serves until the session ends or Close.
func (a *Aggregator) term(ctx context.Context) error {
	sessCtx, sessCancel := context.WithCancel(a.cleanup)
	defer sessCancel()
	abort := context.AfterFunc(ctx, sessCancel)
	sess, err := concurrency.NewSession(a.elect, concurrency.WithTTL(int(a.cfg.SessionTTL/time.Second)), concurrency.WithContext(sessCtx))
	if !abort() {
		if err == nil {
			sess.Orphan()
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("while creating the election session: %w", err)
	}
	defer sess.Close()
	e := concurrency.NewElection(sess, a.cfg.ElectionPrefix)
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
	err = e.Campaign(cctx, a.cfg.Advertise)
	if err != nil {
		cancel()
		<-watch
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("while campaigning: %w", err)
	}
	a.setElected(true)
	a.log.Info("elected region aggregator", "region", a.cfg.Region, "advertise", a.cfg.Advertise)
	select {
	case <-ctx.Done():
	case <-sess.Done():
	}
	a.setElected(false)
	cancel()
	<-watch
	if ctx.Err() != nil {
		rctx, rcancel := context.WithTimeout(a.cleanup, a.cfg.SendTimeout)
		_ = e.Resign(rctx)
		rcancel()
		return nil
	}
	return errors.New("aggregator: election session lost")
}

// setElected starts or ends a term: a new term starts an empty merge (another replica
// served the region meanwhile).
func (a *Aggregator) setElected(on bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if on && !a.elected {
		a.merge = newMerger(a.cfg.Region, a.cfg.MaxEntries, a.cfg.MaxQuotas, a.cfg.MaxMembers, a.cfg.Interval, a.clk.Now())
		a.ans = answer{}
	}
	a.elected = on
	a.lookedAt = time.Time{}
	a.m.elected.Set(map[bool]float64{true: 1, false: 0}[on])
}

// peerMayReport refuses a report for region unless the connection's verified client
// certificate names that region (certs.PeerMayReport).
func peerMayReport(ctx context.Context, region string) error {
	return certs.PeerMayReport(ctx, "aggregator", region)
}

type metrics struct {
	reports, forwards *prometheus.CounterVec
	elected           prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "allot", Subsystem: "aggregator", Name: "reports_total",
			Help: "Enforcer reports received, by result (accepted, duplicate, redirected, invalid, forbidden)."}, []string{"result"}),
		forwards: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "allot", Subsystem: "aggregator", Name: "forwards_total",
			Help: "Merged reports forwarded to the balancer leader, by result (accepted, dropped)."}, []string{"result"}),
		elected: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "allot", Subsystem: "aggregator", Name: "elected",
			Help: "1 while this replica is its region's elected aggregator."}),
	}
	for _, c := range []prometheus.Collector{m.reports, m.forwards, m.elected} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
