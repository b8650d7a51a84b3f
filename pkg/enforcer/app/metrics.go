package app

import (
	"sync"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/fallback"
	"github.com/allot-dev/allot/pkg/lease"
	"github.com/prometheus/client_golang/prometheus"
)

// numLeaseEvents is one past the last lease.Event.
const numLeaseEvents = int(lease.EventEvicted) + 1

// newLeaseMetrics counts lease events and their tokens. Counters are resolved up front:
// the observer runs on the check path and only adds to atomics.
func newLeaseMetrics(reg prometheus.Registerer) lease.Observer {
	events := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allot_lease_events_total",
		Help: "What the lease layer did: lease-hit (answered from leased tokens), refusal-hit, call (a check waited on Redis; call-new, call-expired, call-spent and call-exact say why), refill, expired, evicted, ...",
	}, []string{"event"})
	tokens := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allot_lease_tokens_total",
		Help: "Tokens moved by lease events: spent from leases, asked for, granted, expired unspent, dropped.",
	}, []string{"event"})
	reg.MustRegister(events, tokens)
	var ev, tok [numLeaseEvents]prometheus.Counter
	for i := range ev {
		name := lease.Event(i).String()
		ev[i], tok[i] = events.WithLabelValues(name), tokens.WithLabelValues(name)
	}
	return func(e lease.Event, n int64) {
		if int(e) < numLeaseEvents {
			ev[e].Inc()
			if n > 0 {
				tok[e].Add(float64(n))
			}
		}
	}
}

// fallbackMetrics observes breaker transitions, failures and local answers by reason;
// per-check decisions are already counted by the enforcer (allot_enforcer_decisions_total
// by source).
type fallbackMetrics struct {
	fallback.NopObserver
	transitions *prometheus.CounterVec
	failures    *prometheus.CounterVec
	local       *prometheus.CounterVec
	// byShard caches each shard's local-answer counters (*localCounters by shard name), so
	// an outage, when every check of a shard is answered locally, costs no label lookup
	// per check. The shards are bounded by the fallback layer's breaker table.
	byShard sync.Map
}

type localCounters [fallback.NumLocalReasons]prometheus.Counter

func newFallbackMetrics(reg prometheus.Registerer) *fallbackMetrics {
	m := &fallbackMetrics{
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_fallback_transitions_total",
			Help: "Breaker transitions by shard (a Redis master address) and new state.",
		}, []string{"shard", "to"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_fallback_failures_total",
			Help: "Redis takes that failed (error or deadline) by shard.",
		}, []string{"shard"}),
		local: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_fallback_local_answers_total",
			Help: "Checks answered without Redis (local limits, or refused fail-closed) by shard and why: " +
				"open (the breaker is open), wait (the shard silent past the check's wait, breaker closed: " +
				"the only kind on a healthy cluster), error (the check's call failed), bound (too many calls in flight).",
		}, []string{"shard", "why"}),
	}
	reg.MustRegister(m.transitions, m.failures, m.local)
	return m
}

func (m *fallbackMetrics) Local(shard string, why fallback.LocalReason) {
	if why >= fallback.NumLocalReasons {
		return
	}
	c, ok := m.byShard.Load(shard)
	if !ok {
		var cs localCounters
		for r := range cs {
			cs[r] = m.local.WithLabelValues(shard, fallback.LocalReason(r).String())
		}
		c, _ = m.byShard.LoadOrStore(shard, &cs)
	}
	c.(*localCounters)[why].Inc()
}

func (m *fallbackMetrics) Transition(shard string, _, to fallback.State) {
	m.transitions.WithLabelValues(shard, to.String()).Inc()
}

func (m *fallbackMetrics) Failure(shard string, _ error) { m.failures.WithLabelValues(shard).Inc() }

// DecisionsIgnored implements fallback.DecisionsIgnored: decisions are counted by the
// enforcer, so the Store spares a shard lookup per check.
func (*fallbackMetrics) DecisionsIgnored() {}

var _ fallback.DecisionsIgnored = (*fallbackMetrics)(nil)

// breakerCollector exports each shard's breaker state at scrape time.
type breakerCollector struct{ s *fallback.Store }

var breakerDesc = prometheus.NewDesc("allot_fallback_breaker_state",
	"Breaker state per Redis shard: 0 closed, 1 open, 2 half-open.", []string{"shard"}, nil)

func (b breakerCollector) Describe(ch chan<- *prometheus.Desc) { ch <- breakerDesc }

func (b breakerCollector) Collect(ch chan<- prometheus.Metric) {
	for shard, st := range b.s.States() {
		ch <- prometheus.MustNewConstMetric(breakerDesc, prometheus.GaugeValue, float64(st), shard)
	}
}

// registerLayerMetrics exports the state of the layers App built, read at scrape time.
func registerLayerMetrics(a *App) error {
	var cs []prometheus.Collector
	if a.redisStore != nil {
		r := a.redisStore
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "allot_redis_calls_total",
			Help: "Take scripts sent to Redis (EVALSHA, plus EVAL after NOSCRIPT).",
		}, func() float64 { return float64(r.Calls()) }))
	}
	if l := a.node.Lease(); l != nil {
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "allot_lease_table_keys",
			Help: "Keys in the lease table (leases, refusal-cache entries, busyness counters).",
		}, func() float64 { return float64(l.Len()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "allot_lease_table_capacity",
				Help: "The lease table's hard bound on keys.",
			}, func() float64 { return float64(l.Cap()) }))
	}
	if f := a.node.Fallback(); f != nil {
		cs = append(cs, breakerCollector{f}, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "allot_fallback_local_keys",
			Help: "Identities in the local (degraded) bucket table.",
		}, func() float64 { return float64(f.LocalKeys()) }))
	}
	if m, ok := a.store.(*bucket.Memory); ok {
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "allot_memory_store_keys",
			Help: "Identities the in-memory store holds.",
		}, func() float64 { return float64(m.Len()) }))
	}
	cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "allot_registry_peers",
		Help: "N: live enforcers in this region (static when etcd is not configured).",
	}, func() float64 { return float64(a.peers()) }))
	if a.registry != nil {
		r := a.registry
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "allot_registry_healthy",
			Help: "1 while this enforcer is registered in etcd with a live lease and peer watch.",
		}, func() float64 {
			if r.Healthy() == nil {
				return 1
			}
			return 0
		}))
	}
	cs = append(cs, rulesSourceCollector{a})
	for _, c := range cs {
		if err := a.reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// rulesSourceCollector exports the rules sources' load and failure counts.
type rulesSourceCollector struct{ a *App }

var (
	rulesLoadsDesc = prometheus.NewDesc("allot_rules_loads_total",
		"Rule snapshots a source stored (file, etcd, or xds: envoyproxy/ratelimit's configuration over xDS).", []string{"source"}, nil)
	rulesFailuresDesc = prometheus.NewDesc("allot_rules_failures_total",
		"Rule sets a source rejected (for xds, responses NACKed in whole or part too), or etcd errors; the previous rules kept serving (a refused etcd rule is allot_rules_refused).", []string{"source"}, nil)
	rulesRefusedDesc = prometheus.NewDesc("allot_rules_refused",
		"etcd rules refused now (each serves its previous version, or nothing; /readyz names them); the other rules apply.", []string{"source"}, nil)
)

func (r rulesSourceCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- rulesLoadsDesc
	ch <- rulesFailuresDesc
	ch <- rulesRefusedDesc
}

func (r rulesSourceCollector) Collect(ch chan<- prometheus.Metric) {
	if f := r.a.file; f != nil {
		st, source := f.Status(), "file"
		if r.a.xds != nil {
			source = "xds"
		}
		ch <- prometheus.MustNewConstMetric(rulesLoadsDesc, prometheus.CounterValue, float64(st.Loads), source)
		ch <- prometheus.MustNewConstMetric(rulesFailuresDesc, prometheus.CounterValue, float64(st.Failures), source)
	}
	r.a.mu.Lock()
	src := r.a.etcdSrc
	r.a.mu.Unlock()
	if src != nil {
		st := src.Status()
		ch <- prometheus.MustNewConstMetric(rulesLoadsDesc, prometheus.CounterValue, float64(st.Loads), "etcd")
		ch <- prometheus.MustNewConstMetric(rulesFailuresDesc, prometheus.CounterValue, float64(st.Failures), "etcd")
		ch <- prometheus.MustNewConstMetric(rulesRefusedDesc, prometheus.GaugeValue, float64(len(st.Refused)), "etcd")
	}
}
