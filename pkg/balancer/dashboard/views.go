package dashboard

import (
	"context"
	"math"
	"net/url"
	"slices"
	"time"

	"github.com/allot-dev/allot/pkg/balancer"
)

// common is what every page shows: the role, the term, the refresh, the search box.
type common struct {
	Title      string
	Prefix     string
	Nonce      string
	RefreshMs  int64
	RefreshS   int64
	Now        string
	Leading    bool
	LeaderAddr string
	LeaderDash string // the leader's dashboard URL, when its source knows it
	Term       int64
	Version    uint64
	Landed     uint64
	Learning   bool
	Tracked    int
	Listed     int
	Pending    int
	Legend     []legend
	Query      string
	QueryRule  string
	Window     string
	Samples    int
	Masked     bool   // identities are masked for this viewer
	Viewer     string // the name of the viewer's token, if any
}

type legend struct{ Class, Name string }

func (c common) csp() string {
	return "default-src 'none'; style-src 'unsafe-inline'; script-src 'nonce-" + c.Nonce + "'; form-action 'self'; base-uri 'none'"
}

type regionRow struct {
	Class, Name        string
	Enforcers          int
	LastHeard          string
	ShareAge           string
	Acked              uint64
	Behind             bool
	Status             string
	Quiet              bool
	DriftMax, DriftSum string
	Admitted, Refused  string
}

type idCard struct {
	Rule, Identity, Href string
	Limit                string
	Demand               string
	Admitted, Refused    string
	Refusing             bool
	ShareBar, DemandBar  barView
	Chart                chartView
	Pending              bool
}

type overviewView struct {
	common
	Regions []regionRow
	Drift   chartView
	Cards   []idCard
	More    []idCard
}

type identityRow struct {
	Class, Name                string
	Default, Share, Target     string
	Allowance, Demand, DemandF string
	Admitted, Refused          string
	Acked                      uint64
	Applies                    bool
}

type identityView struct {
	common
	Rule, Identity string
	Found          bool
	Matches        []idCard
	Limit          string
	IDPending      bool
	IDVersion      uint64
	Rows           []identityRow
	ShareBar       barView
	DemandBar      barView
	HasHistory     bool
	ShareChart     chartView
	TokensChart    chartView
	RefusedChart   chartView
	Top            int
}

func (d *Dashboard) common(ctx context.Context, vw viewer, title string, core *balancer.Core, now time.Time, st *balancer.Stats) common {
	c := common{Title: title, Prefix: d.cfg.Prefix, Nonce: nonce(), RefreshMs: d.cfg.Refresh.Milliseconds(),
		RefreshS: int64(math.Ceil(d.cfg.Refresh.Seconds())), Now: now.UTC().Format("2006-01-02 15:04:05 UTC"),
		Window: (time.Duration(d.cfg.Samples) * d.cfg.Every).String(), Samples: d.hist.Len(),
		Masked: !vw.show, Viewer: vw.name}
	for i, r := range d.cfg.Regions {
		c.Legend = append(c.Legend, legend{Class: regionClass(i), Name: r})
	}
	if core == nil {
		c.LeaderAddr, c.Term = d.src.Leader(ctx)
		if ld, ok := d.src.(leaderDashboard); ok && c.LeaderAddr != "" {
			c.LeaderDash = ld.LeaderDashboard(ctx)
		}
		return c
	}
	c.Leading, c.Term, c.Version, c.Landed, c.Learning = true, st.LeaderRev, st.Version, st.Landed, st.Learning
	c.Tracked, c.Listed, c.Pending = st.Tracked, st.Listed, st.Pending
	return c
}

// leaderDashboard is a Source that knows the leader's dashboard URL (balancer.Service).
type leaderDashboard interface {
	LeaderDashboard(ctx context.Context) string
}

func regionClass(i int) string { return "r" + string(rune('0'+i%len(palette))) }

// window is the time span the charts show: the samples held, at most Samples × Every.
func (d *Dashboard) window(ss []sample, now time.Time) (time.Time, time.Time) {
	from := now.Add(-time.Duration(d.cfg.Samples) * d.cfg.Every)
	if len(ss) > 0 && ss[0].at.After(from) {
		from = ss[0].at
	}
	return from, now
}

func (d *Dashboard) overview(ctx context.Context, vw viewer) overviewView {
	now := d.cfg.Clock.Now()
	core := d.src.Core()
	if core == nil {
		return overviewView{common: d.common(ctx, vw, "standby", nil, now, nil)}
	}
	st := core.Stats(now)
	v := overviewView{common: d.common(ctx, vw, "overview", core, now, &st)}
	ss := d.hist.samples()
	var last *sample
	if len(ss) > 0 {
		last = &ss[len(ss)-1]
	}
	for i, r := range st.Regions {
		row := regionRow{Class: regionClass(i), Name: r.Region, Enforcers: r.Enforcers, ShareAge: age(r.ShareAge),
			Acked: r.Acked, Behind: r.Acked < st.Version, Status: "reporting", LastHeard: "never",
			DriftMax: pct(r.DriftMax), DriftSum: rate(r.DriftSum), Admitted: "–", Refused: "–"}
		if !r.LastHeard.IsZero() {
			row.LastHeard = age(now.Sub(r.LastHeard)) + " ago"
		}
		switch {
		case r.Stale:
			row.Status, row.Quiet = "stale: gone quiet", true
		case r.Silent:
			row.Status, row.Quiet = "silent", true
		case r.LastHeard.IsZero():
			row.Status, row.Quiet = "never heard", true
		case r.Fenced:
			row.Status = "reporting; an enforcer fenced (default share held)"
		}
		if last != nil && i < len(last.regions) {
			row.Admitted, row.Refused = rate(last.regions[i].admitted), rate(last.regions[i].refused)
		}
		v.Regions = append(v.Regions, row)
	}
	from, to := d.window(ss, now)
	drift := make([]series, len(d.cfg.Regions))
	for r := range drift {
		drift[r].color = r
		for _, s := range ss {
			p := point{t: s.at, v: math.NaN()}
			if r < len(s.regions) && s.recomputed() {
				p.v = s.regions[r].DriftMax
			}
			drift[r].pts = append(drift[r].pts, p)
		}
	}
	v.Drift = timeChart("drift", 760, 170, from, to, d.gap(), 1, pct, drift)
	v.Drift.EmptyMessage = "no recompute yet"
	if last == nil {
		return v
	}
	for i := range last.ids {
		x := &last.ids[i]
		card := d.card(vw, x, ss, from, to, i < d.cfg.Cards)
		if i < d.cfg.Cards {
			v.Cards = append(v.Cards, card)
		} else {
			v.More = append(v.More, card)
		}
	}
	return v
}

// gap is the longest time between two samples a chart's line joins.
func (d *Dashboard) gap() time.Duration { return 2*d.cfg.Every + d.cfg.Every/2 }

// barW is the width of a card's share and demand bars (px).
const barW = 170

// recomputed: the sample's drift figures are from a recompute (none during learning).
func (s *sample) recomputed() bool { return !s.learning }

func (d *Dashboard) href(rule, identity string) string {
	return d.cfg.Prefix + "/identity?" + url.Values{"rule": {rule}, "identity": {identity}}.Encode()
}

// card is one identity of the overview, from its newest sample x and its history.
func (d *Dashboard) card(vw viewer, x *idSample, ss []sample, from, to time.Time, chart bool) idCard {
	n := len(d.cfg.Regions)
	shown := d.shown(vw, x.k.identity)
	c := idCard{Rule: x.k.rule, Identity: shown, Href: d.href(x.k.rule, shown), Limit: rate(x.rate),
		Demand: rate(x.demand), Admitted: rate(sum(x.admitted(n))), Refused: rate(sum(x.refused(n))), Pending: x.pending}
	c.Refusing = sum(x.refused(n)) > 0
	c.ShareBar = stackedBar(barW, 18, d.cfg.Regions, x.share(n))
	c.DemandBar = stackedBar(barW, 18, d.cfg.Regions, fractions(x.smoothed(n)))
	if chart {
		share, frac := d.idSeries(x.k, ss)
		c.Chart = timeChart("", 330, 120, from, to, d.gap(), 1, pct, append(share, frac...))
	}
	return c
}

// idSeries is, per region, k's share (solid) and demand fraction (dashed) over ss.
func (d *Dashboard) idSeries(k idKey, ss []sample) (share, frac []series) {
	n := len(d.cfg.Regions)
	share, frac = make([]series, n), make([]series, n)
	for r := range n {
		share[r].color, frac[r].color, frac[r].dashed = r, r, true
	}
	for i := range ss {
		x := ss[i].find(k)
		for r := range n {
			ps, pf := point{t: ss[i].at, v: math.NaN()}, point{t: ss[i].at, v: math.NaN()}
			if x != nil {
				ps.v, pf.v = x.share(n)[r], fractions(x.smoothed(n))[r]
			}
			share[r].pts, frac[r].pts = append(share[r].pts, ps), append(frac[r].pts, pf)
		}
	}
	return share, frac
}

func (s *sample) find(k idKey) *idSample {
	for i := range s.ids {
		if s.ids[i].k == k {
			return &s.ids[i]
		}
	}
	return nil
}

// fractions is v over its sum (NaNs as 0); all NaN when the sum is not > 0.
func fractions(v []float64) []float64 {
	out := make([]float64, len(v))
	t := sum(v)
	for i, x := range v {
		out[i] = math.NaN()
		if t > 0 {
			out[i] = 0
			if !math.IsNaN(x) {
				out[i] = x / t
			}
		}
	}
	return out
}

// sum adds the non-NaN values (NaN when all are NaN).
func sum(v []float64) float64 {
	t, any := 0.0, false
	for _, x := range v {
		if !math.IsNaN(x) {
			t, any = t+x, true
		}
	}
	if !any {
		return math.NaN()
	}
	return t
}

// identity is one identity's page. asked is the identity as the viewer names it: as
// itself with a token, else masked (looked up among the history's identities).
func (d *Dashboard) identity(ctx context.Context, vw viewer, rule, asked string) identityView {
	now := d.cfg.Clock.Now()
	core := d.src.Core()
	if core == nil {
		v := identityView{common: d.common(ctx, vw, "standby", nil, now, nil), Rule: rule, Identity: asked}
		v.Query, v.QueryRule = asked, rule
		return v
	}
	st := core.Stats(now)
	v := identityView{common: d.common(ctx, vw, "identity", core, now, &st), Rule: rule, Identity: asked, Top: d.cfg.Top}
	v.Query, v.QueryRule = asked, rule
	ss := d.hist.samples()
	identity := asked
	if !vw.show {
		// A masked name is looked up among the identities the history holds; anything
		// else finds nothing (a viewer without a token cannot probe for a key).
		if identity = d.unmask(ss, asked); identity == "" {
			return v
		}
	}
	if rule == "" { // look it up under every rule we know of (overrides too: one lookup each)
		var cands []string
		if d.cfg.Rules != nil {
			cands = d.cfg.Rules()
		}
		for _, s := range ss {
			for _, x := range s.ids {
				if x.k.identity == identity {
					cands = append(cands, x.k.rule)
				}
			}
		}
		slices.Sort(cands)
		for _, r := range slices.Compact(cands) {
			if _, ok := core.Identity(r, identity); ok || lastSample(ss, idKey{r, identity}) != nil {
				v.Matches = append(v.Matches, idCard{Rule: r, Identity: asked, Href: d.href(r, asked)})
			}
		}
		if len(v.Matches) != 1 {
			return v // none, or several to choose from
		}
		rule = v.Matches[0].Rule
		v.Rule, v.Matches = rule, nil
	}
	last := lastSample(ss, idKey{rule, identity})
	is, ok := core.Identity(rule, identity)
	if !ok {
		// No longer tracked (its demand stopped key_ttl ago): the default split applies,
		// but the hour of history the dashboard kept for it is still worth showing.
		if last != nil {
			v.Limit = rate(last.rate)
			d.idCharts(&v, ss, idKey{rule, identity}, now)
		}
		return v
	}
	n := len(d.cfg.Regions)
	v.Found, v.Limit, v.IDPending, v.IDVersion = true, rate(is.Rate), is.Pending, is.Version
	demF := fractions(pad(is.Smoothed, n))
	v.ShareBar = stackedBar(300, 18, d.cfg.Regions, is.Published)
	v.DemandBar = stackedBar(300, 18, d.cfg.Regions, demF)
	for r, name := range d.cfg.Regions {
		row := identityRow{Class: regionClass(r), Name: name, Default: pct(is.Default[r]), Share: pct(is.Published[r]),
			Target: pct(is.Target[r]), Allowance: rate(is.Published[r] * is.Rate), Demand: rate(pad(is.Smoothed, n)[r]),
			DemandF: pct(demF[r]), Admitted: "–", Refused: "–"}
		if r < len(st.Regions) {
			row.Acked = st.Regions[r].Acked
			row.Applies = row.Acked >= is.Version
		}
		if last != nil {
			row.Admitted, row.Refused = rate(last.admitted(n)[r]), rate(last.refused(n)[r])
		}
		v.Rows = append(v.Rows, row)
	}
	if last == nil {
		return v
	}
	d.idCharts(&v, ss, idKey{rule, identity}, now)
	return v
}

// lastSample is k's newest sample in ss, nil if it has none.
func lastSample(ss []sample, k idKey) *idSample {
	for i := len(ss) - 1; i >= 0; i-- {
		if x := ss[i].find(k); x != nil {
			return x
		}
	}
	return nil
}

// idCharts fills v's history charts for identity k from the samples ss.
func (d *Dashboard) idCharts(v *identityView, ss []sample, k idKey, now time.Time) {
	rule, identity := k.rule, k.identity
	n := len(d.cfg.Regions)
	v.HasHistory = true
	from, to := d.window(ss, now)
	share, frac := d.idSeries(idKey{rule, identity}, ss)
	v.ShareChart = timeChart("share", 760, 170, from, to, d.gap(), 1, pct, append(share, frac...))
	tokens, refused := make([]series, 2*n), make([]series, n)
	for r := range n {
		tokens[r].color, tokens[n+r].color, tokens[n+r].dashed, refused[r].color = r, r, true, r
	}
	for i := range ss {
		x := ss[i].find(idKey{rule, identity})
		for r := range n {
			allow, dem, ref := math.NaN(), math.NaN(), math.NaN()
			if x != nil {
				allow, dem, ref = x.share(n)[r]*x.rate, x.smoothed(n)[r], x.refused(n)[r]
			}
			tokens[r].pts = append(tokens[r].pts, point{ss[i].at, allow})
			tokens[n+r].pts = append(tokens[n+r].pts, point{ss[i].at, dem})
			refused[r].pts = append(refused[r].pts, point{ss[i].at, ref})
		}
	}
	v.TokensChart = timeChart("tokens", 760, 170, from, to, d.gap(), 0, tick, tokens)
	v.RefusedChart = timeChart("refused", 760, 120, from, to, d.gap(), 0, tick, refused)
	v.RefusedChart.EmptyMessage = "no refusal counts yet"
}

// pad returns v with n values (NaN for missing ones).
func pad(v []float64, n int) []float64 {
	if len(v) == n {
		return v
	}
	out := make([]float64, n)
	for i := range out {
		out[i] = math.NaN()
		if i < len(v) {
			out[i] = v[i]
		}
	}
	return out
}
