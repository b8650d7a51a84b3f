package app

import (
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/allot-dev/allot/pkg/adminauth"
	"github.com/allot-dev/allot/pkg/balancer/dashboard"
)

// DashboardConfig: who sees customers' identities (API keys, client addresses) on the
// dashboard. Everyone else sees them masked (dashboard.Config.Viewers): the page itself
// needs no token, so a NOC screen works, but it names no customer.
type DashboardConfig struct {
	// TokensFile holds read-only dashboard tokens, "name:secret" a line; TokensEnv names
	// an environment variable holding "name:secret,..." (default ALLOT_DASHBOARD_TOKENS).
	// Both are read, and the admin API's tokens (when it is on) are viewers too. A
	// viewer presents one as "Authorization: Bearer", or opens /dashboard/?token=<secret>
	// once (kept in a cookie for the dashboard's pages).
	TokensFile string `yaml:"tokens_file"`
	TokensEnv  string `yaml:"tokens_env"`
	// ShowIdentities shows identities to every viewer, token or not: only for a balancer
	// nobody else reaches.
	ShowIdentities bool `yaml:"show_identities"`
}

// viewerTokens loads the tokens that see identities: the dashboard's own (file and
// variable) and, with the admin API on, the admin tokens.
func (a *App) viewerTokens() ([]*adminauth.Tokens, error) {
	var out []*adminauth.Tokens
	dc := a.cfg.Dashboard
	switch {
	case dc.TokensFile != "":
		t, err := adminauth.Load(dc.TokensFile, dc.TokensEnv, nil)
		if err != nil {
			return nil, fmt.Errorf("app: dashboard.tokens_file: %w", err)
		}
		out = append(out, t)
	case dc.TokensEnv != "" && strings.TrimSpace(os.Getenv(dc.TokensEnv)) != "":
		t, err := adminauth.Parse(os.Getenv(dc.TokensEnv))
		if err != nil {
			return nil, fmt.Errorf("app: dashboard: $%s: %w", dc.TokensEnv, err)
		}
		out = append(out, t)
	}
	if ac := a.cfg.Admin; ac.Enabled {
		t, err := adminauth.Load(ac.TokensFile, ac.TokensEnv, nil)
		if err != nil {
			return nil, fmt.Errorf("app: admin: %w", err)
		}
		out = append(out, t)
	}
	return out, nil
}

// buildDashboard makes the dashboard over the service: one sample per balancing
// interval, rules from the same table the core reads.
func (a *App) buildDashboard() (err error) {
	dc := dashboard.DefaultConfig()
	dc.Regions, dc.Every, dc.Rules = a.cfg.Regions, a.cfg.Balance.Interval, a.table.Rules
	if dc.Viewers, err = a.viewerTokens(); err != nil {
		return err
	}
	dc.ShowIdentities = a.cfg.Dashboard.ShowIdentities
	a.dash, err = dashboard.New(dc, a.svc)
	n := 0
	for _, t := range dc.Viewers {
		n += t.Len()
	}
	a.log.Info("dashboard identities", "shown_to_all", dc.ShowIdentities, "viewer_tokens", n)
	return err
}

// serveDashboard mounts the dashboard at /dashboard/ and sends / there. a.dash is built
// after the mux (it needs the service, which needs the bound address) and before Run.
func (a *App) serveDashboard(mux *http.ServeMux) {
	mux.Handle("/dashboard/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { a.dash.ServeHTTP(w, r) }))
	mux.Handle("GET /{$}", http.RedirectHandler("/dashboard/", http.StatusFound))
}
