package dashboard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/balancer"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/testenv/poll"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

func get(t *testing.T, h http.Handler, path string) (*http.Response, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	res := rec.Result()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

func get2(t *testing.T, h http.Handler, path string) string {
	t.Helper()
	_, page := get(t, h, path)
	return page
}

func mustContain(t *testing.T, page string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(page, w) {
			t.Errorf("page lacks %q", w)
		}
	}
}

var dataPointsRE = regexp.MustCompile(`id="drift"[^>]*data-points="(\d+)"`)

func TestOverviewOnTheLeader(t *testing.T) {
	d, _, _ := run(t, 10*time.Minute, nil)
	res, page := get(t, d, "/dashboard/")
	if res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("status %d, content type %q", res.StatusCode, res.Header.Get("Content-Type"))
	}
	mustContain(t, page, "LEADER", "term 42", "us-east", "eu-west", "ap-south", "key:k_acme", "global limit 500/s",
		`href="/dashboard/identity?identity=key%3Ak_acme&amp;rule=pro"`)
	m := dataPointsRE.FindStringSubmatch(page)
	if m == nil {
		t.Fatal("no drift chart")
	}
	if n, _ := strconv.Atoi(m[1]); n < 3*50 {
		t.Errorf("drift chart: %d points, want ≥ 150 (3 regions, ~60 samples after learning)", n)
	}
	// The one script is the page's own, allowed by the nonce in the policy.
	csp := res.Header.Get("Content-Security-Policy")
	nm := regexp.MustCompile(`'nonce-([^']+)'`).FindStringSubmatch(csp)
	if nm == nil || !strings.Contains(page, `<script nonce="`+nm[1]+`">`) || strings.Count(page, "<script") != 1 {
		t.Errorf("CSP %q and the page's scripts disagree", csp)
	}
	if _, again := get(t, d, "/dashboard"); strings.Contains(again, nm[1]) {
		t.Error("the nonce did not change between two pages")
	}
}

// Identities are the clients': a name with markup in it renders as text, in the page's
// text, its links and its search box alike.
func TestHostileIdentitiesRenderInert(t *testing.T) {
	d, _, _ := run(t, 5*time.Minute, nil)
	for _, path := range []string{"/dashboard/", "/dashboard/identity?" + url.Values{"identity": {evilScript}}.Encode(),
		"/dashboard/identity?" + url.Values{"identity": {evilImg}, "rule": {"default"}}.Encode()} {
		_, page := get(t, d, path)
		if strings.Contains(page, evilScript) || strings.Contains(page, "<img") || strings.Contains(page, `onerror="`) {
			t.Errorf("%s: a hostile identity is in the page unescaped", path)
		}
		if strings.Count(page, "<script") != 1 {
			t.Errorf("%s: %d script elements, want the page's one", path, strings.Count(page, "<script"))
		}
	}
	_, page := get(t, d, "/dashboard/identity?"+url.Values{"identity": {evilScript}}.Encode())
	mustContain(t, page, `<h1 id="identity">&lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt;</h1>`)
}

func TestIdentityPage(t *testing.T) {
	d, _, _ := run(t, 10*time.Minute, nil)
	_, page := get(t, d, "/dashboard/identity?identity=key:k_globex") // no rule: found under "default"
	mustContain(t, page, "rule <b>default</b>", "global limit <b>100/s</b>", `id="share"`, `id="tokens"`, `id="refused"`,
		`<td class="l"><span class="sw r1"></span>eu-west</td>`, "v", "✓")
	_, page = get(t, d, "/dashboard/identity?identity=key:nobody")
	mustContain(t, page, `id="not-tracked"`, "default split")
	_, page = get(t, d, "/dashboard/identity?identity=key:k_globex&rule=pro")
	mustContain(t, page, `id="not-tracked"`, "under rule <b>pro</b>")
	// Issue 28, item 7: a key whose traffic stopped is forgotten by the balancer after
	// key_ttl, but the page still shows the history the dashboard kept of it.
	_, page = get(t, d, "/dashboard/identity?identity=key:k_gone")
	mustContain(t, page, `id="not-tracked"`, `id="history-kept"`, `id="share"`, `id="tokens"`, `id="refused"`, "global limit 100/s")
	// Tracked but never in the top: its state, and no history.
	_, page = get(t, d, "/dashboard/identity?identity=key:tail-29&rule=default")
	mustContain(t, page, "No history", "Per region")
	res, _ := get(t, d, "/dashboard/identity")
	if res.StatusCode != http.StatusSeeOther {
		t.Errorf("empty search: status %d, want a redirect to the overview", res.StatusCode)
	}
	if res, _ := get(t, d, "/dashboard/nope"); res.StatusCode != http.StatusNotFound {
		t.Errorf("unknown page: status %d", res.StatusCode)
	}
	rec := httptest.NewRecorder()
	d.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/dashboard/", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST: status %d", rec.Code)
	}
}

// A standby shows no data as current: it says it is a standby and names the leader.
func TestStandbyPointsToTheLeader(t *testing.T) {
	d, src, _ := run(t, 5*time.Minute, nil)
	src.setCore(nil)
	for _, path := range []string{"/dashboard/", "/dashboard/identity?identity=key:k_acme"} {
		_, page := get(t, d, path)
		mustContain(t, page, "STANDBY", `id="standby"`, `<b id="leader">10.0.0.7:9090</b>`, "term 42")
		if strings.Contains(page, `id="regions"`) || strings.Contains(page, "key:k_acme</a>") || strings.Contains(page, `id="share"`) {
			t.Errorf("%s: a standby shows data", path)
		}
	}
	mustContain(t, get2(t, d, "/dashboard/"), "open the dashboard on that host")
	src.dash = "http://10.0.0.7:9091/dashboard/" // the leader published it (issue 28, item 7)
	mustContain(t, get2(t, d, "/dashboard/"), `its dashboard is <a id="leader-dashboard" href="http://10.0.0.7:9091/dashboard/">`)
	src.leader = ""
	_, page := get(t, d, "/dashboard/")
	mustContain(t, page, "No leader is known")
	// Standing by records nothing and forgets the counts of the term that ended.
	n := d.History().Len()
	d.Sample(t0.Add(time.Hour))
	if d.History().Len() != n {
		t.Error("a standby sample was recorded")
	}
	d.History().mu.Lock()
	if len(d.History().tracked) != 0 {
		t.Error("a standby keeps counting for the last term's top")
	}
	d.History().mu.Unlock()
}

// The history's size depends on the configuration only: a client inventing keys (each a
// little traffic, in reports and in the Core) cannot grow it past Samples × Top
// identities, here even once the real keys went quiet and the invented ones (new ones
// every interval) make up each sample's top.
func TestHistoryBounded(t *testing.T) {
	d, src, clk := run(t, 10*time.Minute, func(c *Config) { c.Samples, c.Top, c.Cards = 20, 5, 5 })
	core := src.Core()
	h := d.History()
	for i := range 30 {
		clk.Advance(10 * time.Second)
		now := clk.Now()
		for _, region := range regions {
			req := &allotv1.ReportRequest{Region: region, EnforcerId: "flood-" + region, Seq: uint64(i + 1),
				IntervalStartMs: now.Add(-10 * time.Second).UnixMilli(), IntervalEndMs: now.UnixMilli()}
			for k := range 500 {
				req.Usage = append(req.Usage, &allotv1.IdentityUsage{Rule: "default", Identity: fmt.Sprintf("key:invented-%d-%d", i, k), Admitted: 0.2})
			}
			if err := core.Ingest(now, req); err != nil {
				t.Fatal(err)
			}
			h.Observe(req)
		}
		if p := core.Tick(now); p != nil {
			core.Published(p, now)
		}
		d.Sample(now)
	}
	if st := core.Stats(clk.Now()); st.Tracked+int(st.Evicted) < 15000 {
		t.Fatalf("the core tracked %d identities and evicted %d: the flood (15,000) did not reach it", st.Tracked, st.Evicted)
	}
	if h.Len() != 20 {
		t.Errorf("history holds %d samples, want Samples = 20", h.Len())
	}
	if n := h.identities(); n > 20*5 {
		t.Errorf("history refers to %d identities, want ≤ Samples × Top = 100", n)
	}
	h.mu.Lock()
	if len(h.tracked) > 5 {
		t.Errorf("%d identities counted, want ≤ Top = 5", len(h.tracked))
	}
	h.mu.Unlock()
}

func TestAdmittedAndRefusedPerSecond(t *testing.T) {
	d, _, _ := run(t, 10*time.Minute, nil)
	ss := d.History().samples()
	last := ss[len(ss)-1]
	x := last.find(idKey{"default", "key:k_initech"}) // 40/s a region against a limit of 100
	if x == nil {
		t.Fatal("key:k_initech not in the last sample")
	}
	adm, ref := sum(x.admitted(3)), sum(x.refused(3))
	if math.Abs(adm-100) > 5 || math.Abs(ref-20) > 5 {
		t.Errorf("k_initech: admitted %g/s refused %g/s, want ≈ 100 and 20", adm, ref)
	}
	if r := last.regions[0]; !(r.admitted > 400) {
		t.Errorf("us-east admitted %g/s, want > 400 (k_acme alone is 430)", r.admitted)
	}
}

// Tap counts what the server accepted, nothing else, and answers as the server did.
func TestTapCountsAcceptedReportsOnly(t *testing.T) {
	cc := balancer.DefaultCoreConfig()
	cc.Regions, cc.Limits = regions, limits
	core, err := balancer.NewCore(cc)
	if err != nil {
		t.Fatal(err)
	}
	src := &fakeSource{core: core}
	cfg := DefaultConfig()
	cfg.Regions, cfg.Clock = regions, clock.NewFake(t0)
	d, err := New(cfg, src)
	if err != nil {
		t.Fatal(err)
	}
	d.Sample(t0)
	rep := func(region string, adm float64) *allotv1.ReportRequest {
		return &allotv1.ReportRequest{Region: region, EnforcerId: "e", Seq: 1, IntervalStartMs: 0, IntervalEndMs: 1,
			Usage: []*allotv1.IdentityUsage{{Rule: "default", Identity: "k", Admitted: adm}}}
	}
	for _, tc := range []struct {
		srv allotv1.BalancerServer
	}{
		{answer{resp: &allotv1.ReportResponse{Accepted: true}}},
		{answer{resp: &allotv1.ReportResponse{Accepted: false, LeaderAddr: "x"}}}, // a standby's redirect
		{answer{err: errors.New("invalid")}},
	} {
		if _, err := Tap(tc.srv, d).Report(context.Background(), rep("us-east", 10)); err != nil && tc.srv.(answer).err == nil {
			t.Fatal(err)
		}
	}
	d.Sample(t0.Add(10 * time.Second))
	ss := d.History().samples()
	if got := ss[len(ss)-1].regions[0].admitted; got != 1 {
		t.Errorf("admitted %g/s, want 1 (10 tokens over 10 s, the accepted report only)", got)
	}
}

type answer struct {
	allotv1.UnimplementedBalancerServer
	resp *allotv1.ReportResponse
	err  error
}

func (a answer) Report(context.Context, *allotv1.ReportRequest) (*allotv1.ReportResponse, error) {
	return a.resp, a.err
}

func TestRunSamplesEveryInterval(t *testing.T) {
	d, _, clk := run(t, time.Minute, func(c *Config) { c.Samples = 100 })
	before := d.History().Len()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	for i := range 3 {
		poll.True(t, 5*time.Second, "Run waits for the next sample", func() bool { return clk.Timers() > 0 })
		clk.Advance(10 * time.Second)
		poll.True(t, 5*time.Second, fmt.Sprintf("sample %d", i+1), func() bool { return d.History().Len() == before+i+1 })
	}
	cancel()
	<-done
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Regions = nil }, "Regions is empty"},
		{func(c *Config) { c.Every = 0 }, "Every 0s"},
		{func(c *Config) { c.Samples = MaxSamples + 1 }, "Samples 8641"},
		{func(c *Config) { c.Top = 0 }, "Top 0"},
		{func(c *Config) { c.Cards = 21 }, "Cards 21"},
		{func(c *Config) { c.Refresh = -time.Second }, "Refresh -1s"},
		{func(c *Config) { c.Prefix = "/dashboard/" }, `Prefix "/dashboard/"`},
	} {
		cfg := DefaultConfig()
		cfg.Regions = regions
		tc.mod(&cfg)
		if _, err := New(cfg, &fakeSource{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want one naming %q", err, tc.want)
		}
	}
}

func TestTimeChartBreaksAtGaps(t *testing.T) {
	pts := []point{{t0, 0.5}, {t0.Add(time.Minute), 0.25}, {t0.Add(2 * time.Minute), math.NaN()}, {t0.Add(3 * time.Minute), 1}}
	c := timeChart("x", 200, 100, t0, t0.Add(3*time.Minute), time.Hour, 1, pct, []series{{color: 1, pts: pts}})
	if len(c.Lines) != 2 || c.Points != 3 || c.Empty {
		t.Fatalf("lines %+v points %d: want 2 lines, 3 points", c.Lines, c.Points)
	}
	// x from 44 to 190, y from 82 (0) to 8 (1).
	if c.Lines[0].Points != "44,45 92.7,63.5" || c.Lines[1].Points != "190,8" {
		t.Errorf("points %q %q", c.Lines[0].Points, c.Lines[1].Points)
	}
	if g := timeChart("x", 200, 100, t0, t0.Add(3*time.Minute), 90*time.Second, 1, pct, []series{{pts: pts[:2]}, {pts: []point{pts[0], pts[3]}}}); len(g.Lines) != 3 {
		t.Errorf("a 3-minute gap: %d lines, want 3 (one joined, one broken)", len(g.Lines))
	}
	if e := timeChart("x", 200, 100, t0, t0, time.Hour, 0, rate, nil); !e.Empty {
		t.Error("a chart without points is not empty")
	}
	for v, want := range map[float64]string{0: "0", 50: "50", 0.125: "0.125", 1234.5: "1230", 25000: "25k"} {
		if got := tick(v); got != want {
			t.Errorf("tick(%g) = %q, want %q", v, got, want)
		}
	}
	for v, want := range map[float64]float64{0: 1, 0.7: 1, 1.3: 2, 37: 50, 120: 200, 600: 1000} {
		if got := niceCeil(v); got != want {
			t.Errorf("niceCeil(%g) = %g, want %g", v, got, want)
		}
	}
}
