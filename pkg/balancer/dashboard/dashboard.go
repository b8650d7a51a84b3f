package dashboard

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/allot-dev/allot/pkg/adminauth"
	"github.com/allot-dev/allot/pkg/balancer"
	"github.com/allot-dev/allot/pkg/clock"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// Config configures a Dashboard. Start from DefaultConfig and set Regions.
type Config struct {
	// Regions in the Core's order (CoreConfig.Regions). Required.
	Regions []string
	// Every is the sample period. Default 10s (the balancing interval).
	Every time.Duration
	// Samples is the ring's length: Samples × Every is the history shown. Default 360
	// (one hour at 10s). At most MaxSamples.
	Samples int
	// Top is how many identities, the most demanded, each sample keeps. Default 20. At
	// most MaxTop.
	Top int
	// Cards is how many of them the overview draws a chart for (the rest are listed).
	// Default 8, at most Top.
	Cards int
	// Refresh is how often the page reloads itself. Default 10s.
	Refresh time.Duration
	// Prefix is the path the dashboard is mounted at. Default "/dashboard".
	Prefix string
	// Rules lists the rule ids to look an identity up under when a search names no rule
	// (balancer.RuleTable.Rules). nil: only the rules of identities in the history.
	Rules func() []string
	// Clock: default the wall clock.
	Clock clock.Clock
	// Viewers are the tokens that see identities (API keys, addresses): the admin API's
	// and read-only dashboard tokens. Without one of them, identities are masked (see
	// viewer.go). Empty: masked for everyone, unless ShowIdentities.
	Viewers []*adminauth.Tokens
	// ShowIdentities shows identities to every viewer, token or not: only for a dashboard
	// nobody else reaches (the demo on loopback).
	ShowIdentities bool
	// MaskKey keys the masked identities' hash. nil: a random key per process.
	MaskKey []byte
}

// Bounds of Config.Samples and Config.Top: the history's memory is bounded by them (see
// the package doc).
const (
	MaxSamples = 8640 // a day at 10s
	MaxTop     = 200
)

// DefaultConfig returns the defaults above (no regions).
func DefaultConfig() Config {
	return Config{Every: 10 * time.Second, Samples: 360, Top: 20, Cards: 8, Refresh: 10 * time.Second, Prefix: "/dashboard"}
}

// Validate names the bad fields and values.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("dashboard: Config."+format, a...))
	}
	if len(c.Regions) == 0 {
		bad("Regions is empty")
	}
	if c.Every <= 0 {
		bad("Every %v, must be > 0", c.Every)
	}
	if c.Samples <= 0 || c.Samples > MaxSamples {
		bad("Samples %d, must be in [1, %d]", c.Samples, MaxSamples)
	}
	if c.Top <= 0 || c.Top > MaxTop {
		bad("Top %d, must be in [1, %d]", c.Top, MaxTop)
	}
	if c.Cards <= 0 || c.Cards > c.Top {
		bad("Cards %d, must be in [1, Top %d]", c.Cards, c.Top)
	}
	if c.Refresh <= 0 {
		bad("Refresh %v, must be > 0", c.Refresh)
	}
	if c.Prefix == "" || c.Prefix[0] != '/' || c.Prefix[len(c.Prefix)-1] == '/' {
		bad("Prefix %q, must start with / and not end with one", c.Prefix)
	}
	return errors.Join(errs...)
}

// Source is the balancer replica the dashboard reads (*balancer.Service).
type Source interface {
	// Core is the current term's core, nil while standing by.
	Core() *balancer.Core
	// Leader is the leader's report address and term (from the election).
	Leader(ctx context.Context) (addr string, term int64)
}

// Dashboard serves the balancer's pages (an http.Handler for Prefix and below) from a
// History it fills every Every (Run) and from the Core's state at the time of the
// request. It never renders under the Core's mutex: it copies (Stats, Identity, Top)
// and renders the copies. Safe for concurrent use. Build it with New.
type Dashboard struct {
	cfg  Config
	src  Source
	hist *History
}

// New validates cfg; src is read on every sample and request.
func New(cfg Config, src Source) (*Dashboard, error) {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real()
	}
	if cfg.MaskKey == nil {
		cfg.MaskKey = newMaskKey()
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if src == nil {
		return nil, errors.New("dashboard: nil Source")
	}
	return &Dashboard{cfg: cfg, src: src, hist: NewHistory(cfg.Regions, cfg.Samples, cfg.Top)}, nil
}

// History is the dashboard's history (for tests and simulations that sample by hand).
func (d *Dashboard) History() *History { return d.hist }

// Sample takes one sample of the source now (nothing on a standby).
func (d *Dashboard) Sample(now time.Time) { d.hist.Sample(now, d.src.Core()) }

// Observe counts an accepted report (see History.Observe); Tap calls it.
func (d *Dashboard) Observe(r *allotv1.ReportRequest) { d.hist.Observe(r) }

// Run samples every Every until ctx ends, in the caller's goroutine.
func (d *Dashboard) Run(ctx context.Context) {
	for {
		t := d.cfg.Clock.NewTimer(d.cfg.Every)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		d.Sample(d.cfg.Clock.Now())
	}
}

// Tap returns srv with every report it accepts also counted by d (admitted and refused
// figures); the answer is srv's, unchanged.
func Tap(srv allotv1.BalancerServer, d *Dashboard) allotv1.BalancerServer { return tap{srv, d} }

type tap struct {
	allotv1.BalancerServer
	d *Dashboard
}

func (t tap) Report(ctx context.Context, req *allotv1.ReportRequest) (*allotv1.ReportResponse, error) {
	resp, err := t.BalancerServer.Report(ctx, req)
	if err == nil && resp.GetAccepted() {
		t.d.Observe(req)
	}
	return resp, err
}

// ServeHTTP serves Prefix (the overview) and Prefix/identity?identity=…&rule=… (one
// identity). GET and HEAD only.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "dashboard: GET only", http.StatusMethodNotAllowed)
		return
	}
	if p := r.URL.Path; p != d.cfg.Prefix && p != d.cfg.Prefix+"/" && p != d.cfg.Prefix+"/identity" {
		http.NotFound(w, r)
		return
	}
	vw, token, redirect, err := d.viewerOf(r)
	if err != nil {
		d.clearTokenCookie(w)
		unauthorized(w, err)
		return
	}
	if redirect != "" { // ?token=: keep it in a cookie, not in the address bar
		d.setTokenCookie(w, r, token)
		w.Header().Set("Cache-Control", "no-store")
		http.Redirect(w, r, redirect, http.StatusSeeOther)
		return
	}
	var v interface{ csp() string }
	var name string
	switch r.URL.Path {
	case d.cfg.Prefix, d.cfg.Prefix + "/":
		v, name = d.overview(r.Context(), vw), "overview"
	default:
		q := r.URL.Query()
		if q.Get("identity") == "" {
			http.Redirect(w, r, d.cfg.Prefix+"/", http.StatusSeeOther)
			return
		}
		v, name = d.identity(r.Context(), vw, q.Get("rule"), q.Get("identity")), "identity"
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	// Nothing but this page's own style and its one script (by nonce) may run: an identity
	// that slipped past escaping still could not load or run anything.
	w.Header().Set("Content-Security-Policy", v.csp())
	if err := pages.ExecuteTemplate(w, name, v); err != nil {
		http.Error(w, "dashboard: "+err.Error(), http.StatusInternalServerError)
	}
}
