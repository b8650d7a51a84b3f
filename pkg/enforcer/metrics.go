package enforcer

import (
	"time"

	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/prometheus/client_golang/prometheus"
)

// API names a front end, for the bounded "api" label.
type API uint8

// The front ends.
const (
	APIEnvoyRLS  API = iota // envoy.service.ratelimit.v3 ShouldRateLimit
	APIAllot                // allot.v1 Check
	APIHTTPCheck            // POST /v1/check
	APIHTTPAuth             // GET /v1/auth (forward auth)
	numAPIs
)

var apiNames = [numAPIs]string{"envoy-rls", "allot", "http-check", "http-auth"}

func (a API) String() string {
	if a < numAPIs {
		return apiNames[a]
	}
	return "unknown"
}

// metrics are the enforcer's Prometheus metrics, resolved once so the hot path only adds
// to atomics. Label sets are bounded: results × sources, apis, fail modes, and plans (at
// most MaxPlanLabels + 2, see planmetrics.go).
type metrics struct {
	checks      checkStats            // decisions by result and source, and check latency (checkstats.go)
	shadow      [3]prometheus.Counter // would-allow, would-refuse, error
	storeErrors [2]prometheus.Counter // [fail mode]
	invalid     [numAPIs]prometheus.Counter
	globShadow  [numAPIs]prometheus.Counter // requests a global shadow mode admitted
	plans       *planMetrics                // decisions by bounded plan (planmetrics.go)
	releases    [2]prometheus.Counter       // in-flight slots released, unknown
	settles     [numSettleResults]prometheus.Counter
}

// released counts in-flight releases: ok slots given back, unknown ones not held.
func (m *metrics) released(ok, unknown int) {
	m.releases[0].Add(float64(ok))
	m.releases[1].Add(float64(unknown))
}

const (
	shadowAllow = iota
	shadowRefuse
	shadowError
)

func newMetrics(reg prometheus.Registerer, holder *rules.Holder, clk clock.Clock) (*metrics, error) {
	m := &metrics{plans: newPlanMetrics()}
	shadow := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allot_enforcer_shadow_decisions_total",
		Help: "Shadow rule evaluations: would-allow, would-refuse, or error (store failed). Never enforced.",
	}, []string{"result"})
	m.shadow[shadowAllow] = shadow.WithLabelValues("would-allow")
	m.shadow[shadowRefuse] = shadow.WithLabelValues("would-refuse")
	m.shadow[shadowError] = shadow.WithLabelValues("error")
	storeErrors := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allot_enforcer_store_errors_total",
		Help: "Takes the store could not answer even with the fallback layer, by the rule's fail mode (open: allowed, closed: refused).",
	}, []string{"fail_mode"})
	m.storeErrors[rules.FailOpen] = storeErrors.WithLabelValues("open")
	m.storeErrors[rules.FailClosed] = storeErrors.WithLabelValues("closed")
	invalid := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allot_enforcer_invalid_requests_total",
		Help: "Checks rejected as invalid input (InvalidArgument / 400), by front end.",
	}, []string{"api"})
	globShadow := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allot_enforcer_global_shadow_total",
		Help: "Requests a front end in global shadow mode answered OK although a rule refused them (envoyproxy/ratelimit's SHADOW_MODE), by front end.",
	}, []string{"api"})
	for a := API(0); a < numAPIs; a++ {
		m.invalid[a] = invalid.WithLabelValues(a.String())
		m.globShadow[a] = globShadow.WithLabelValues(a.String())
	}
	rulesAge := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "allot_enforcer_rules_age_seconds",
		Help: "Seconds since the rules snapshot in use was compiled.",
	}, func() float64 {
		s := holder.Current()
		if s == nil || s.Created().IsZero() {
			return 0
		}
		return clk.Now().Sub(s.Created()).Seconds()
	})
	rulesCount := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "allot_enforcer_rules",
		Help: "Rules in the snapshot in use.",
	}, func() float64 {
		if s := holder.Current(); s != nil {
			return float64(s.Len())
		}
		return 0
	})
	releases := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allot_enforcer_inflight_releases_total",
		Help: "In-flight slots given back (released), and releases of slots held no longer (unknown: released already, expired or never held).",
	}, []string{"result"})
	m.releases[0] = releases.WithLabelValues("released")
	m.releases[1] = releases.WithLabelValues("unknown")
	settles := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allot_enforcer_settlements_total",
		Help: "Settlements of costs known after the response, per rule and identity: settled (a check's handle), unknown (handle unknown, expired or settled already), unmarked (Envoy's stream-done hits and negative hits), error (the store could not answer).",
	}, []string{"result"})
	for i, n := range settleResultNames {
		m.settles[i] = settles.WithLabelValues(n)
	}
	for _, c := range []prometheus.Collector{&m.checks, shadow, storeErrors, invalid, globShadow, rulesAge, rulesCount, &rulesInfo{holder: holder}, m.plans.vec, releases, settles} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// rulesInfo exports allot_enforcer_rules_info{version="..."} 1 for the snapshot in use,
// at scrape time: one series at a time whatever the number of versions seen.
type rulesInfo struct{ holder *rules.Holder }

var rulesInfoDesc = prometheus.NewDesc("allot_enforcer_rules_info",
	"The version of the rules snapshot in use (value always 1).", []string{"version"}, nil)

func (r *rulesInfo) Describe(ch chan<- *prometheus.Desc) { ch <- rulesInfoDesc }

func (r *rulesInfo) Collect(ch chan<- prometheus.Metric) {
	v := ""
	if s := r.holder.Current(); s != nil {
		v = s.Version()
	}
	ch <- prometheus.MustNewConstMetric(rulesInfoDesc, prometheus.GaugeValue, 1, v)
}

// observe records one finished check of a request naming plan, decided under snap.
func (m *metrics) observe(d *Decision, snap *rules.Snapshot, plan string, took time.Duration) {
	a := 0
	if d.Allowed {
		a = 1
	}
	m.checks.observe(a, d.Source, took)
	m.plans.counter(snap, plan, a).Inc()
}
