package app

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/enforcer/overrides"
)

// SharesConfig: the per-identity shares the quota balancer publishes in etcd.
type SharesConfig struct {
	// Disabled: do not watch the balancer's shares; every identity keeps the default split.
	Disabled bool `yaml:"disabled"`
	// EtcdPrefix is where the balancer publishes (watched when etcd.endpoints is set).
	// Default contract.SharesPrefix, "/allot/shares/".
	EtcdPrefix string `yaml:"etcd_prefix"`
	// StaleAfter: shares not refreshed by the balancer for this long fall back to
	// min(last share, default share). Default 5m; must be > 0.
	StaleAfter time.Duration `yaml:"stale_after"`
	// Floor is the share each identity enforces after a start until the share set has
	// been read from etcd (an enforcer restarted while etcd is unreachable does not know
	// what the balancer gave this region): min(default share, floor). Keep it at most the
	// balancer's share.floor. Default the balancer's default: min(0.01, 0.02 / (regions −
	// 1)); in [0, 1].
	Floor *float64 `yaml:"floor"`
}

// watchShares says whether the balancer's shares are watched.
func (c *Config) watchShares() bool { return len(c.Etcd.Endpoints) > 0 && !c.Shares.Disabled }

// validateShares checks regions, shares and the removed rules.default_share.
func (c *Config) validateShares(bad func(format string, a ...any)) {
	if c.Rules.DefaultShare != nil {
		bad("rules.default_share %g is no longer supported: a rule without shares: for a region now gets the default split "+
			"by region weight; list the regions under regions: (e.g. regions: {us-east: 1, eu-west: 1}; none means one region, share 1) and remove it",
			*c.Rules.DefaultShare)
	}
	if f := c.Shares.Floor; f != nil && !(*f >= 0 && *f <= 1) {
		bad("shares.floor %g, must be in [0, 1]", *f)
	}
	for _, name := range slices.Sorted(maps.Keys(c.Regions)) {
		if w := c.Regions[name]; math.IsNaN(w) || math.IsInf(w, 0) || w <= 0 || w > 1e6 {
			bad("regions: %s weight %g, must be finite and in (0, 1e6]", name, w)
		}
	}
	if len(c.Regions) > 0 && c.Region != "" {
		if _, ok := c.Regions[c.Region]; !ok {
			bad("region %q is not one of regions (%s)", c.Region, c.Regions)
		}
	}
	if c.Shares.StaleAfter <= 0 {
		bad("shares.stale_after %v, must be > 0", c.Shares.StaleAfter)
	}
	if c.watchShares() && c.Shares.EtcdPrefix == "" {
		bad("shares.etcd_prefix is empty; set it (default %s) or shares.disabled: true", contract.SharesPrefix)
	}
}

// startShares builds, with etcd, the watcher that feeds the node's share table, loading
// the published set once at start (bounded by Etcd.StartTimeout) so a restarted enforcer
// does not enforce the default split over a smaller published share.
func (a *App) startShares() (err error) {
	if !a.cfg.watchShares() {
		return nil
	}
	wc := overrides.DefaultWatcherConfig()
	wc.Prefix, wc.Clock, wc.Logger = a.cfg.Shares.EtcdPrefix, a.clock, a.log
	if a.sharesW, err = overrides.NewWatcher(a.etcd, a.node.Shares(), wc); err != nil {
		return fmt.Errorf("app: shares: %w", err)
	}
	ctx, cancel := context.WithTimeout(a.ctx, a.cfg.Etcd.StartTimeout)
	defer cancel()
	if err := a.sharesW.Load(ctx); err != nil {
		a.log.Warn("shares not loaded from etcd at start; enforcing min(default share, floor) until they are",
			"floor", a.node.Config().Shares.Floor, "error", err)
	}
	return nil
}

// Shares returns the holder of the per-identity shares in force (Applied() is what usage
// reports carry). Never nil; without etcd it holds no set and gives the default split.
func (a *App) Shares() *overrides.Holder { return a.node.Shares() }
