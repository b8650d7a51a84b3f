package app

import (
	"fmt"
	"math"
	"time"

	"github.com/allot-dev/allot/pkg/fallback"
	"github.com/allot-dev/allot/pkg/lease"
	"github.com/allot-dev/allot/pkg/quota"
)

// Configuration errors are errors: in the tuning sections a zero (or absent) value means
// the layer's default, and a negative one — `fallback.timeout: -5ms` — is refused with
// the field named, never silently replaced by the default. Then the layers' own configs,
// built exactly as the app builds them, are validated too (so, e.g., a reply_timeout
// below timeout is refused before anything starts).

// validateSections checks the store, etcd, balancer, rules, listen timings, shutdown,
// lease, fallback and check sections.
func (c *Config) validateSections() []error {
	var errs []error
	neg := func(field string, v float64, shown any) {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			errs = append(errs, fmt.Errorf("app: config: %s %v, must be > 0 (0 or absent: the default)", field, shown))
		}
	}
	dur := func(field string, d time.Duration) { neg(field, float64(d), d) }
	num := func(field string, n int64) { neg(field, float64(n), n) }

	s := c.Store
	dur("store.dial_timeout", s.DialTimeout)
	dur("store.read_timeout", s.ReadTimeout)
	dur("store.write_timeout", s.WriteTimeout)
	num("store.pool_size", int64(s.PoolSize))
	num("store.max_keys", int64(s.MaxKeys))
	e := c.Etcd
	dur("etcd.dial_timeout", e.DialTimeout)
	dur("etcd.start_timeout", e.StartTimeout)
	b := c.Balancer
	dur("balancer.interval", b.Interval)
	dur("balancer.send_timeout", b.SendTimeout)
	num("balancer.capacity", int64(b.Capacity))
	num("balancer.max_identities", int64(b.MaxIdentities))
	r := c.Rules
	dur("rules.poll_interval", r.PollInterval)
	if r.IPv6Prefix < 0 || r.IPv6Prefix > 128 {
		errs = append(errs, fmt.Errorf("app: config: rules.ipv6_prefix %d, must be in [1, 128] (0: 64)", r.IPv6Prefix))
	}
	l := c.Lease
	dur("lease.ttl", l.TTL)
	dur("lease.quiet_ttl", l.QuietTTL)
	dur("lease.window", l.Window)
	num("lease.busy_hits", int64(l.BusyHits))
	num("lease.max_keys", int64(l.MaxKeys))
	dur("lease.sight_every", l.SightEvery)
	dur("lease.sight_ttl", l.SightTTL)
	f := c.Fallback
	dur("fallback.timeout", f.Timeout)
	dur("fallback.reply_timeout", f.ReplyTimeout)
	dur("fallback.all_silent_for", f.AllSilentFor)
	dur("fallback.probe_timeout", f.ProbeTimeout)
	num("fallback.trip_after", int64(f.TripAfter))
	dur("fallback.first_open_for", f.FirstOpenFor)
	dur("fallback.open_for", f.OpenFor)
	num("fallback.max_in_flight", int64(f.MaxInFlight))
	neg("fallback.slack", f.Slack, f.Slack)
	num("fallback.max_local_keys", int64(f.MaxLocalKeys))
	dur("quota.flush", c.Quota.Flush)
	dur("quota.keep", c.Quota.Keep)
	num("quota.max_entries", int64(c.Quota.MaxEntries))
	dur("listen.max_connection_age_grace", c.Listen.MaxConnectionAgeGrace)
	if c.Listen.MaxConnectionAge <= 0 {
		errs = append(errs, fmt.Errorf("app: config: listen.max_connection_age %v, must be > 0 (default %v)", c.Listen.MaxConnectionAge, DefaultMaxConnectionAge))
	}
	if c.Shutdown.PreStopDelay < 0 {
		errs = append(errs, fmt.Errorf("app: config: shutdown.pre_stop_delay %v, must be >= 0 (0: none)", c.Shutdown.PreStopDelay))
	}
	ch := c.Check
	num("check.max_descriptors", int64(ch.MaxDescriptors))
	num("check.max_entries", int64(ch.MaxEntries))
	num("check.max_key_len", int64(ch.MaxKeyLen))
	num("check.max_value_len", int64(ch.MaxValueLen))
	num("check.max_hits", ch.MaxHits)
	dur("check.reset_jitter_max", ch.ResetJitterMax)
	dur("check.settle_window", ch.SettleWindow)
	if len(errs) > 0 {
		return errs // the layers' checks would only repeat these
	}

	if c.Store.Kind != "memory" {
		if err := c.fallbackConfig().Validate(); err != nil {
			errs = append(errs, fmt.Errorf("app: config: fallback section: %w", err))
		}
		if !c.Lease.Disabled {
			if err := c.leaseConfig().Validate(); err != nil {
				errs = append(errs, fmt.Errorf("app: config: lease section: %w", err))
			}
		}
	}
	if qc := c.quotaConfig(); true {
		if err := qc.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("app: config: quota section: %w", err))
		}
	}
	if err := c.enforcerConfig().Limits.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("app: config: check section: %w", err))
	}
	return errs
}

// fallbackConfig applies the fallback section over fallback.DefaultConfig (the wiring —
// clock, peers, shard, logger, observer — is the caller's).
func (c *Config) fallbackConfig() fallback.Config {
	fc := fallback.DefaultConfig()
	f := c.Fallback
	overrideIfSet(&fc.Timeout, f.Timeout)
	overrideIfSet(&fc.ReplyTimeout, f.ReplyTimeout)
	overrideIfSet(&fc.AllSilentFor, f.AllSilentFor)
	if f.AllSilentFor == 0 && fc.AllSilentFor < fc.ReplyTimeout {
		fc.AllSilentFor = fc.ReplyTimeout // a long reply_timeout alone does not make the default an error
	}
	overrideIfSet(&fc.ProbeTimeout, f.ProbeTimeout)
	overrideIfSet(&fc.MaxInFlight, f.MaxInFlight)
	overrideIfSet(&fc.TripAfter, f.TripAfter)
	overrideIfSet(&fc.OpenFor, f.OpenFor)
	overrideIfSet(&fc.FirstOpenFor, f.FirstOpenFor)
	if f.FirstOpenFor == 0 && fc.FirstOpenFor > fc.OpenFor {
		fc.FirstOpenFor = fc.OpenFor // a short open_for alone does not make the default an error
	}
	overrideIfSet(&fc.Slack, f.Slack)
	overrideIfSet(&fc.MaxLocalKeys, f.MaxLocalKeys)
	return fc
}

// quotaConfig applies the quota section over quota.DefaultConfig.
func (c *Config) quotaConfig() quota.Config {
	qc := quota.DefaultConfig()
	overrideIfSet(&qc.Flush, c.Quota.Flush)
	overrideIfSet(&qc.Keep, c.Quota.Keep)
	if c.Quota.Keep == 0 && qc.Keep < qc.Flush {
		qc.Keep = qc.Flush // a long flush alone does not make the default keep an error
	}
	overrideIfSet(&qc.MaxEntries, c.Quota.MaxEntries)
	return qc
}

// leaseConfig applies the lease section over lease.DefaultConfig.
func (c *Config) leaseConfig() lease.Config {
	lc := lease.DefaultConfig()
	l := c.Lease
	overrideIfSet(&lc.LeaseTTL, l.TTL)
	overrideIfSet(&lc.QuietTTL, l.QuietTTL)
	if l.QuietTTL == 0 && lc.QuietTTL < lc.LeaseTTL {
		lc.QuietTTL = lc.LeaseTTL // a long ttl alone does not make the default quiet_ttl an error
	}
	overrideIfSet(&lc.Window, l.Window)
	overrideIfSet(&lc.BusyHits, l.BusyHits)
	overrideIfSet(&lc.MaxKeys, l.MaxKeys)
	overrideIfSet(&lc.SightEvery, l.SightEvery)
	overrideIfSet(&lc.SightTTL, l.SightTTL)
	return lc
}
