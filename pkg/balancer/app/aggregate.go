package app

import (
	"fmt"
	"slices"
	"time"

	"github.com/allot-dev/allot/pkg/aggregator"
	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/tlsfiles"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// AggregateConfig turns a balancer process into its region's report aggregator
// (pkg/aggregator, docs/design.md §12) instead of a balancer replica: it serves the same
// report API to the region's enforcers (those with balancer.via_aggregator), on
// listen.grpc with listen.tls, campaigns on the region's aggregator election in etcd,
// and forwards one merged report per interval to the balancer leader found on
// etcd.election_prefix. Off while Region is empty (the default).
type AggregateConfig struct {
	// Region whose enforcers it serves; one of regions. "" : not an aggregator.
	Region string `yaml:"region"`
	// ElectionPrefix is the aggregators' election prefix (the enforcers'
	// balancer.aggregator_prefix). Default contract.AggregatorPrefix.
	ElectionPrefix string `yaml:"election_prefix"`
	// Interval between forwards. Default balance.interval (the enforcers' interval).
	Interval time.Duration `yaml:"interval"`
	// UpstreamTLS is the connection to the balancer leader: the region's report
	// certificate (cert_file, key_file: the leader takes the members it lists for that
	// region only) and ca_file verifying the balancer. Required unless
	// listen.insecure_reports (then plaintext).
	UpstreamTLS tlsfiles.Client `yaml:"upstream_tls"`
	// UpstreamAddrs, if set, are the balancer replicas' report addresses as this region
	// reaches them (its own links, a proxy), tried in turn from the one that last accepted,
	// instead of the leader's address advertised in etcd (the enforcers' balancer.addrs).
	UpstreamAddrs []string `yaml:"upstream_addrs"`
	// MaxMembers caps the enforcers behind it (keep it at most balance.max_enforcers).
	// Default 4096.
	MaxMembers int `yaml:"max_members"`
}

// aggregating reports whether this process is a region's aggregator.
func (c *Config) aggregating() bool { return c.Aggregate.Region != "" }

// validateAggregate checks the aggregate section.
func (c *Config) validateAggregate() []error {
	if !c.aggregating() {
		return nil
	}
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("app: config: aggregate."+format, a...)) }
	ag := c.Aggregate
	if !slices.Contains(c.Regions, ag.Region) {
		bad("region %q is not one of regions %v", ag.Region, c.Regions)
	}
	if ag.Interval < 0 || ag.MaxMembers < 0 {
		bad("interval %v, max_members %d: must be >= 0 (0: the default)", ag.Interval, ag.MaxMembers)
	}
	for i, addr := range ag.UpstreamAddrs {
		if err := aggregator.CheckAddr(addr); err != nil {
			bad("upstream_addrs[%d]: %v", i, err)
		}
	}
	if t := ag.UpstreamTLS; !c.Listen.InsecureReports && (!t.Enabled || t.CertFile == "" || t.KeyFile == "") {
		bad("upstream_tls: set enabled, cert_file and key_file (the region's report certificate) and ca_file: the leader believes members only from the region's certificate")
	}
	return errs
}

// buildAggregator makes the region's aggregator on the bound report listener.
func (a *App) buildAggregator() error {
	ag := a.cfg.Aggregate
	up, err := ag.UpstreamTLS.Build()
	if err != nil {
		return fmt.Errorf("app: aggregate.upstream_tls: %w", err)
	}
	ac := aggregator.DefaultConfig()
	ac.Region, ac.ID = ag.Region, a.cfg.ID
	ac.Advertise = a.cfg.Listen.Advertise
	if ac.Advertise == "" {
		ac.Advertise = a.GRPCAddr()
	}
	ac.Etcd, ac.ElectionPrefix = a.etcd, contract.AggregatorElection(ag.ElectionPrefix, ag.Region)
	ac.Upstream, ac.TLS = aggregator.EtcdUpstream(a.etcd, a.cfg.Etcd.ElectionPrefix), up
	ac.Addrs = ag.UpstreamAddrs // as this region reaches the replicas: Upstream is not asked
	ac.Interval = a.cfg.Balance.Interval
	if ag.Interval > 0 {
		ac.Interval = ag.Interval
	}
	ac.AckGap = min(ac.AckGap, ac.Interval)
	if ag.MaxMembers > 0 {
		ac.MaxMembers = ag.MaxMembers
	}
	ac.MaxEntries = min(ac.MaxEntries, a.cfg.Balance.MaxEntries)
	ac.SessionTTL = a.cfg.Etcd.SessionTTL
	ac.RegionFromPeer = a.cfg.Listen.mutualTLS()
	ac.Logger, ac.Registerer = a.log.Named("aggregator"), a.reg
	if a.agg, err = aggregator.New(ac); err != nil {
		return err
	}
	allotv1.RegisterBalancerServer(a.srv.GRPC, a.agg)
	a.log.Info("report aggregator", "region", ag.Region, "advertise", ac.Advertise, "election", ac.ElectionPrefix)
	return nil
}
