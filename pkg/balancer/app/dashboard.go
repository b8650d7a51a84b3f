package app

import (
	"net/http"

	"github.com/allot-dev/allot/pkg/balancer/dashboard"
)

// buildDashboard makes the dashboard over the service: one sample per balancing
// interval, rules from the same table the core reads.
func (a *App) buildDashboard() (err error) {
	dc := dashboard.DefaultConfig()
	dc.Regions, dc.Every, dc.Rules = a.cfg.Regions, a.cfg.Balance.Interval, a.table.Rules
	a.dash, err = dashboard.New(dc, a.svc)
	return err
}

// serveDashboard mounts the dashboard at /dashboard/ and sends / there. a.dash is built
// after the mux (it needs the service, which needs the bound address) and before Run.
func (a *App) serveDashboard(mux *http.ServeMux) {
	mux.Handle("/dashboard/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { a.dash.ServeHTTP(w, r) }))
	mux.Handle("GET /{$}", http.RedirectHandler("/dashboard/", http.StatusFound))
}
