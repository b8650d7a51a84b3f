package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/enforcer/overrides"
	"github.com/allot-dev/allot/pkg/enforcer/report"
	"github.com/allot-dev/allot/pkg/routine"
	"github.com/allot-dev/allot/pkg/rules"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// The simulated enforcers of BenchmarkBalancerScale: each a real usage table and Reporter
// fed a synthetic key mix (see the benchmark's doc), and per region one real share
// watcher whose applied versions every enforcer of the region reports.

// scaleZipfS is the exponent of the hot keys' Zipf rates and the tail keys' counts.
const scaleZipfS = 1.1

// probeID is the identity whose traffic moves from us-east to eu-west when the measured
// window starts (rule "probe").
const probeID = "key:probe"

// scaleMix is one step's key mix: the hot keys every enforcer sees, the tail keys each
// enforcer sees alone (or, over a population, a few enforcers), and the rules.
type scaleMix struct {
	step       scaleStep
	hot        []string  // the hot keys' identities, by rank
	hotRate    []float64 // each hot key's requests/s over the whole fleet
	limit      float64   // the default rule's global rate and burst
	probeLimit float64   // the probe rule's
	tail       []string  // the tail keys' identities, by rank
	tailTok    []int64   // tokens an interval of each tail key, from each enforcer that sees it
	perEnf     int       // tail keys per enforcer
}

// newScaleMix builds the mix of st at rate requests/s per enforcer over the hot keys.
func newScaleMix(st scaleStep, rate float64) *scaleMix {
	hc := hotKeys(st.ids)
	m := &scaleMix{step: st, perEnf: st.ids - hc}
	h := 0.0
	for k := range hc {
		h += math.Pow(float64(k+1), -scaleZipfS)
	}
	total := rate * float64(st.enforcers)
	for k := range hc {
		m.hot = append(m.hot, "key:h"+strconv.Itoa(k))
		m.hotRate = append(m.hotRate, total*math.Pow(float64(k+1), -scaleZipfS)/h)
	}
	// The five busiest keys over their limit (refused, reported under pressure); the
	// sixth at it; the rest under.
	m.limit = math.Ceil(m.hotRate[min(5, hc-1)])
	m.probeLimit = 100 * float64(st.enforcers)
	pop := st.enforcers * m.perEnf
	if st.population > 0 {
		pop = min(pop, st.population-hc)
	}
	m.tail = make([]string, pop)
	m.tailTok = make([]int64, pop)
	for t := range pop {
		m.tail[t] = "key:t" + strconv.Itoa(t)
		m.tailTok[t] = max(1, int64(math.Round(4*math.Pow(1+float64(t)/float64(hc), -scaleZipfS))))
	}
	return m
}

// rulesYAML is the rules both sides load: every key at limit/s (burst as much), the probe
// at probeLimit/s.
func (m *scaleMix) rulesYAML() string {
	return fmt.Sprintf(`version: scale
rules:
  - id: default
    limits: [{name: second, rate: %.0f, per: 1s, burst: %.0f}]
  - id: probe
    match: {plan: scale-probe}
    limits: [{name: second, rate: %.0f, per: 1s, burst: %.0f}]
`, m.limit, m.limit, m.probeLimit, m.probeLimit)
}

// scaleFleet is one step's simulated enforcers.
type scaleFleet struct {
	k       scaleKnobs
	mix     *scaleMix
	addr    string
	reg     *prometheus.Registry // every reporter's metrics, labelled by enforcer
	regions []*scaleRegion

	mu          sync.Mutex // mu guards enfs, measuring, lat, acceptedIDs and probe
	enfs        []*simEnforcer
	measuring   bool
	lat         []time.Duration
	acceptedIDs float64 // identities in the reports the leader accepted
	probe       probeState

	probeIn atomic.Int32    // the region the probe's traffic comes from
	fanout  routine.Routine // the regions' share fan-out
}

// scaleRegion is one region's share table, its watcher and its compiled rules.
type scaleRegion struct {
	name    string
	idx     int
	n       int // enforcers of the region
	holder  *overrides.Holder
	watcher *overrides.Watcher
	def     *rules.Compiled
	probe   *rules.Compiled
	tls     *tls.Config
}

type probeState struct {
	moved, report, dec, inc time.Time
	settled                 bool          // us-east held ≥ 0.9 of the probe when it moved
	decBelow                float64       // us-east's share under this is the move's first version
	done                    chan struct{} // closed when the move is done (inc)
}

// simEnforcer is one simulated enforcer: a usage table, its Reporter and its feeder.
type simEnforcer struct {
	g      int // index in the fleet
	region *scaleRegion
	id     string
	table  *report.Table
	rep    *report.Reporter
	acks   chan struct{} // the Reporter's SharesChanged
	clock  *fedClock     // the table's and the Reporter's time: up to where it is fed
	feed   routine.Routine
	// Tokens owed (fractions carried from slot to slot) and allowed by the region's share
	// (carried up to a second's worth), per hot key; the probe's last.
	owed, allowed []float64
}

// newScaleFleet builds the regions' share tables and watchers (loaded from etcd) for the
// fleet of mix, reporting to addr. No enforcer runs before start.
//
// tlsByRegion is each region's enforcer client TLS (testenv.EnforcerTLS).
func newScaleFleet(cli *clientv3.Client, sharesPrefix, addr string, tlsByRegion map[string]*tls.Config, mix *scaleMix, k scaleKnobs) (*scaleFleet, error) {
	fl := &scaleFleet{k: k, mix: mix, addr: addr, reg: prometheus.NewRegistry()}
	fl.probe.done = make(chan struct{})
	weights := map[string]float64{}
	for _, r := range scaleRegions {
		weights[r] = 1
	}
	set, err := rules.ParseYAML([]byte(mix.rulesYAML()))
	if err != nil {
		return nil, err
	}
	for i, name := range scaleRegions {
		snap, err := rules.Compile(set, rules.CompileOptions{Region: name, Regions: weights})
		if err != nil {
			return nil, err
		}
		hc := overrides.DefaultConfig()
		hc.Region, hc.WaitForSet = name, true
		h, err := overrides.NewHolder(hc)
		if err != nil {
			return nil, err
		}
		wc := overrides.DefaultWatcherConfig()
		wc.Prefix = sharesPrefix
		w, err := overrides.NewWatcher(cli, h, wc)
		if err != nil {
			return nil, err
		}
		r := &scaleRegion{name: name, idx: i, holder: h, watcher: w, def: snap.Rule("default"), probe: snap.Rule("probe"),
			tls: tlsByRegion[name]}
		fl.regions = append(fl.regions, r)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = w.Load(ctx)
		cancel()
		if err == nil {
			err = w.Start()
		}
		if err != nil {
			fl.close()
			return nil, fmt.Errorf("while watching %s's shares: %w", name, err)
		}
	}
	for g := range mix.step.enforcers {
		fl.regions[g%len(scaleRegions)].n++
	}
	if err := fl.fanout.Start(fl.fanOut); err != nil {
		fl.close()
		return nil, err
	}
	return fl, nil
}

// start starts the enforcers one by one, spread over one interval (as a fleet's are: not
// all reporting at the same instant), each reporting an interval after its start.
func (fl *scaleFleet) start(ctx context.Context) error {
	n := fl.mix.step.enforcers
	t0 := time.Now()
	for g := range n {
		if d := time.Until(t0.Add(time.Duration(g) * fl.k.interval / time.Duration(n))); d > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(d):
			}
		}
		e, err := fl.newEnforcer(g)
		if err != nil {
			return err
		}
		fl.mu.Lock()
		fl.enfs = append(fl.enfs, e)
		fl.mu.Unlock()
		if err := e.feed.Start(func(ctx context.Context) { fl.run(ctx, e) }); err != nil {
			return err
		}
	}
	return nil
}

func (fl *scaleFleet) newEnforcer(g int) (*simEnforcer, error) {
	r := fl.regions[g%len(scaleRegions)]
	e := &simEnforcer{g: g, region: r, id: fmt.Sprintf("sim-%s-%04d", r.name, g/len(scaleRegions)), clock: newFedClock(time.Now()),
		acks: make(chan struct{}, 1), owed: make([]float64, len(fl.mix.hot)+1), allowed: make([]float64, len(fl.mix.hot)+1)}
	uc := report.DefaultConfig()
	uc.Interval = fl.k.interval
	uc.EarlyGap = min(uc.EarlyGap, fl.k.interval)
	uc.MaxIdentities = fl.mix.step.ids
	uc.Capacity = tableCapacity(fl.mix.step.ids+1, uc.Stripes)
	uc.RegionalRate = func(rule *rules.Compiled, identity string, now time.Time) float64 {
		return rule.Global[0].Rate * r.holder.Share(rule, identity, now)
	}
	t, err := report.NewTable(uc, e.clock.Now())
	if err != nil {
		return nil, err
	}
	e.table = t
	rc := report.DefaultReporterConfig()
	rc.Table, rc.Region, rc.EnforcerID = t, r.name, e.id
	rc.Leader = report.StaticLeader(fl.addr)
	rc.Shares, rc.SharesChanged = r.holder.Applied, e.acks
	rc.Clock = e.clock
	rc.DialOptions = []grpc.DialOption{grpc.WithChainUnaryInterceptor(fl.timeReport)}
	rc.Registerer = prometheus.WrapRegistererWith(prometheus.Labels{"enforcer": e.id}, fl.reg)
	rc.TLS = r.tls
	if fl.k.log != "" { // ALLOT_SCALE_LOG: each failed or dropped report, and why
		rc.Logger = hclog.New(&hclog.LoggerOptions{Name: e.id, Level: hclog.Warn, Output: os.Stderr})
	}
	if e.rep, err = report.NewReporter(rc); err != nil {
		return nil, err
	}
	return e, nil
}

// tableCapacity is a usage table's capacity for ids identities an interval: enough that
// no stripe evicts (each holds its mean plus five standard deviations of a hash's spread).
func tableCapacity(ids, stripes int) int {
	m := (ids + stripes - 1) / stripes
	return stripes * (m + int(math.Ceil(5*math.Sqrt(float64(m)))) + 8)
}

// run feeds e's table once a slot until ctx ends. A slot whose tick came late (a busy
// machine) is fed at its own time, as the traffic would have been, and e's clock moves to
// the end of the slots fed: the table's counts and recent rates are those of steady
// traffic however late this goroutine runs, and the Reporter never drains a second the
// feeder has not counted yet. (A feeder that skipped late ticks lost traffic, and one
// drained behind its feeder showed its busy keys' recent rates falling: both read as
// moves to the balancer's shift detector, and cost recomputes.) At most an interval is
// caught up.
func (fl *scaleFleet) run(ctx context.Context, e *simEnforcer) {
	slots := int(fl.k.interval / report250ms)
	tk := time.NewTicker(report250ms)
	defer tk.Stop()
	next, s := time.Now(), 0
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tk.C:
			if now.Sub(next) > fl.k.interval {
				skip := int(now.Sub(next)/report250ms) - slots
				next, s = next.Add(time.Duration(skip)*report250ms), (s+skip)%slots
			}
			for ; !next.After(now); next = next.Add(report250ms) {
				fl.feed(e, next, s, slots)
				s = (s + 1) % slots
				e.clock.fed(next.Add(report250ms))
			}
		}
	}
}

// feed observes one slot of e's traffic at now: every hot key's (and the probe's, in the
// region it comes from) part of the slot, admitted up to what the region's share allows
// this enforcer, and the tail keys whose turn the slot is, each its interval's tokens.
func (fl *scaleFleet) feed(e *simEnforcer, now time.Time, s, slots int) {
	r, m := e.region, fl.mix
	n := float64(r.n)
	sec := report250ms.Seconds()
	take := func(i int, rule *rules.Compiled, id string, rate, limit float64) {
		e.owed[i] += rate / n * sec
		tok := int64(e.owed[i])
		e.owed[i] -= float64(tok)
		per := limit * r.holder.Share(rule, id, now) / n // this enforcer's part of the region's rate
		e.allowed[i] = min(e.allowed[i]+per*sec, per)
		adm := min(tok, int64(e.allowed[i]))
		e.allowed[i] -= float64(adm)
		e.table.ObserveTake(rule, id, adm, true, false, bucket.SourceLease, now)
		e.table.ObserveTake(rule, id, tok-adm, false, false, bucket.SourceRefusalCache, now)
	}
	for k, id := range m.hot {
		w := 0.2
		if k%len(scaleRegions) == r.idx {
			w = 0.6
		}
		take(k, r.def, id, m.hotRate[k]*w, m.limit)
	}
	if int(fl.probeIn.Load()) == r.idx {
		take(len(m.hot), r.probe, probeID, 0.9*m.probeLimit, m.probeLimit)
	}
	pop := len(m.tail)
	for i := s; i < m.perEnf; i += slots {
		t := (e.g*m.perEnf + i) % pop
		e.table.ObserveTake(r.def, m.tail[t], m.tailTok[t], true, false, bucket.SourceLease, now)
	}
}

// timeReport is every Reporter's client interceptor: it times each Report call, from
// sending the report to the leader's answer (encoding, the RPC, the leader's decoding and
// ingestion), in the measured window; counts the identities of the reports accepted; and
// notes when the first report that carries the probe's move was sent.
func (fl *scaleFleet) timeReport(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	began := time.Now()
	err := invoker(ctx, method, req, reply, cc, opts...)
	d := time.Since(began)
	rq, ok := req.(*allotv1.ReportRequest)
	if err != nil || !ok {
		return err
	}
	fl.mu.Lock()
	defer fl.mu.Unlock()
	fl.acceptedIDs += float64(len(rq.GetUsage()))
	if fl.measuring {
		fl.lat = append(fl.lat, d)
	}
	p := &fl.probe
	if !p.moved.IsZero() && p.report.IsZero() && (rq.GetRegion() == scaleRegions[0] || rq.GetRegion() == scaleRegions[1]) &&
		time.UnixMilli(rq.GetIntervalEndMs()).After(p.moved.Add(2*report250ms)) {
		p.report = began // drained (on its enforcer's clock) after the move had been fed
	}
	return err
}

// fanOut passes each region's new share sets on to its enforcers' Reporters (each
// acknowledges the version in an early report, as a real enforcer does) and times the
// probe's move.
func (fl *scaleFleet) fanOut(ctx context.Context) {
	cases := make([]<-chan struct{}, len(fl.regions))
	for i, r := range fl.regions {
		cases[i] = r.holder.Changed()
	}
	for {
		var r *scaleRegion
		select {
		case <-ctx.Done():
			return
		case <-cases[0]:
			r = fl.regions[0]
		case <-cases[1]:
			r = fl.regions[1]
		case <-cases[2]:
			r = fl.regions[2]
		}
		now := time.Now()
		fl.mu.Lock()
		for _, e := range fl.enfs {
			if e.region == r {
				select {
				case e.acks <- struct{}{}:
				default:
				}
			}
		}
		p := &fl.probe
		if !p.moved.IsZero() {
			s := r.holder.Share(r.probe, probeID, now)
			if r.idx == 0 && p.dec.IsZero() && s < p.decBelow {
				p.dec = now
			}
			if r.idx == 1 && p.inc.IsZero() && s >= 0.9 {
				p.inc = now
				close(p.done)
			}
		}
		fl.mu.Unlock()
	}
}

// moveProbe sends the probe's traffic from eu-west from now on.
func (fl *scaleFleet) moveProbe(now time.Time) {
	fl.mu.Lock()
	s := fl.regions[0].holder.Share(fl.regions[0].probe, probeID, now)
	fl.probe.moved, fl.probe.settled = now, s >= 0.9
	fl.probe.decBelow = min(0.5, s-0.1) // lowered: below half, and by more than a dead-band's move
	fl.mu.Unlock()
	fl.probeIn.Store(1)
}

// waitProbe waits for the probe's move to be done, at most d.
func (fl *scaleFleet) waitProbe(d time.Duration) {
	select {
	case <-fl.probe.done:
	case <-time.After(d):
	}
}

type probeTimes struct {
	settled                bool
	firstVersion, moveDone float64 // seconds from the first report after the move; -1: not seen
}

func (fl *scaleFleet) probeTimes() probeTimes {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	p := fl.probe
	out := probeTimes{settled: p.settled, firstVersion: -1, moveDone: -1}
	if p.report.IsZero() {
		return out
	}
	if !p.dec.IsZero() {
		out.firstVersion = p.dec.Sub(p.report).Seconds()
	}
	if !p.inc.IsZero() {
		out.moveDone = p.inc.Sub(p.report).Seconds()
	}
	return out
}

// measure starts (on) or ends the window whose report latencies are kept.
func (fl *scaleFleet) measure(on bool) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	fl.measuring = on
	if on {
		fl.lat = nil
	}
}

func (fl *scaleFleet) latencies() []time.Duration {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	return append([]time.Duration(nil), fl.lat...)
}

// fleetCounts are the Reporters' counters summed over the fleet, and the identities of
// the reports the leader accepted.
type fleetCounts struct{ sent, failures, dropped, early, identities, accepted float64 }

func (c fleetCounts) sub(o fleetCounts) fleetCounts {
	return fleetCounts{c.sent - o.sent, c.failures - o.failures, c.dropped - o.dropped, c.early - o.early,
		c.identities - o.identities, c.accepted - o.accepted}
}

func (fl *scaleFleet) sample() fleetCounts {
	var c fleetCounts
	fl.mu.Lock()
	c.accepted = fl.acceptedIDs
	fl.mu.Unlock()
	mfs, err := fl.reg.Gather()
	if err != nil {
		return c
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "allot_usage_reports_sent_total":
				c.sent += m.GetCounter().GetValue()
			case "allot_usage_report_failures_total":
				c.failures += m.GetCounter().GetValue()
			case "allot_usage_reports_dropped_total":
				c.dropped += m.GetCounter().GetValue()
			case "allot_usage_reports_early_total":
				c.early += m.GetCounter().GetValue()
			case "allot_usage_report_identities":
				c.identities += m.GetHistogram().GetSampleSum()
			}
		}
	}
	return c
}

// close stops the feeders, the Reporters, the fan-out and the watchers, and waits for
// them. Safe after a failed newScaleFleet or start.
func (fl *scaleFleet) close() {
	fl.mu.Lock()
	enfs := fl.enfs
	fl.mu.Unlock()
	for _, e := range enfs {
		e.feed.Close()
	}
	var wg sync.WaitGroup
	for i := range 8 { // closing a thousand gRPC connections one by one takes a while
		wg.Go(func() {
			for j := i; j < len(enfs); j += 8 {
				_ = enfs[j].rep.Close()
			}
		})
	}
	wg.Wait()
	fl.fanout.Close()
	for _, r := range fl.regions {
		_ = r.watcher.Close()
	}
}

// fedClock is a simulated enforcer's time: the end of the slots its feeder has counted,
// so its table is drained (its Reporter reads Now) only up to traffic it has seen. Its
// timers are the wall clock's. Safe for concurrent use.
type fedClock struct{ ns atomic.Int64 }

func newFedClock(t time.Time) *fedClock {
	c := &fedClock{}
	c.ns.Store(t.UnixNano())
	return c
}

func (c *fedClock) Now() time.Time                       { return time.Unix(0, c.ns.Load()) }
func (c *fedClock) NewTimer(d time.Duration) clock.Timer { return clock.Real().NewTimer(d) }
func (c *fedClock) fed(t time.Time)                      { c.ns.Store(t.UnixNano()) }
