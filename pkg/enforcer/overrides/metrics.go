package overrides

import (
	"github.com/prometheus/client_golang/prometheus"
)

type outcome int

const (
	appliedSet outcome = iota
	ignoredOlder
	numOutcomes
)

type metrics struct {
	sets [numOutcomes]prometheus.Counter
}

// newMetrics registers the Holder's metrics. State is read at scrape time from the set in
// force (no work on the check path).
func newMetrics(reg prometheus.Registerer, h *Holder) (*metrics, error) {
	sets := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "allot_shares_sets_total",
		Help: "Share sets offered to this enforcer, by outcome: applied (swapped in) or ignored (not newer: an older leader or version).",
	}, []string{"outcome"})
	m := &metrics{}
	m.sets[appliedSet] = sets.WithLabelValues("applied")
	m.sets[ignoredOlder] = sets.WithLabelValues("ignored")
	cs := []prometheus.Collector{
		sets,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "allot_shares_age_seconds",
			Help: "Seconds since the balancer last confirmed the share set in force (since start before any set). Past the staleness period listed identities enforce min(last, default share).",
		}, func() float64 { return h.Age(h.cfg.Clock.Now()).Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "allot_shares_stale",
			Help: "1 when the share set in force is past the staleness period (identities enforce min(last, default share)), else 0.",
		}, func() float64 { return b2f(h.Stale(h.cfg.Clock.Now())) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "allot_shares_cut_off",
			Help: "1 while this enforcer fenced itself as cut off from the control plane while its region's other enforcers are heard (identities enforce min(last, default share) until a report is accepted and a set read again), else 0.",
		}, func() float64 { return b2f(!h.Cut().IsZero()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "allot_shares_loaded",
			Help: "1 once a share set was loaded (or none is published); 0 while waiting for it, when every identity enforces min(default share, floor).",
		}, func() float64 { return b2f(h.Loaded()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "allot_shares_version",
			Help: "Version of the share set in force (0 before any).",
		}, func() float64 { _, v := h.Applied(); return float64(v) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "allot_shares_leader_rev",
			Help: "Fencing token (the publishing leader's election revision) of the share set in force.",
		}, func() float64 { r, _ := h.Applied(); return float64(r) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "allot_shares_entries",
			Help: "Identities the share set in force lists (the rest keep the default split).",
		}, func() float64 { return float64(h.Len()) }),
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
