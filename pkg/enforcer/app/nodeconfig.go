package app

import "github.com/allot-dev/allot/pkg/enforcer/node"

// nodeConfig is the enforcer node's settings from this configuration (pkg/enforcer/node):
// the store's layers, the balancer's shares (read from etcd, unless shares.disabled) and
// the usage reports (balancer.enabled).
func (c *Config) nodeConfig() node.Config {
	nc := node.DefaultConfig()
	nc.Region, nc.ID = c.Region, c.ID
	nc.Check = c.enforcerConfig()
	nc.Layers = c.Store.Kind != "memory" // fallback → lease over Redis; memory alone is exact
	nc.Lease, nc.NoLease = c.leaseConfig(), c.Lease.Disabled
	nc.Fallback = c.fallbackConfig()
	nc.Quota = c.quotaConfig()
	nc.Balanced = c.watchShares()
	nc.Shares.Stale = c.Shares.StaleAfter
	nc.Shares.Floor = node.ShareFloor(len(c.Regions))
	if c.Shares.Floor != nil {
		nc.Shares.Floor = *c.Shares.Floor
	}
	nc.Reports = c.Balancer.Enabled
	overrideIfSet(&nc.Usage.Interval, c.Balancer.Interval)
	overrideIfSet(&nc.Usage.Capacity, c.Balancer.Capacity)
	overrideIfSet(&nc.Usage.MaxIdentities, c.Balancer.MaxIdentities)
	return nc
}
