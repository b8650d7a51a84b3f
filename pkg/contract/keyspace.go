package contract

import "strings"

// The etcd keyspace. Every prefix is configurable where it is used (a deployment may run
// several allot installations in one etcd); these are the defaults, and the only place
// they are written.
const (
	// RulesPrefix holds one rule per key (pkg/rules.EtcdSource), written by the admin API.
	RulesPrefix = "/allot/rules/"
	// EnforcersPrefix holds each enforcer's registration, <prefix><region>/<id>, under a
	// lease (pkg/registry).
	EnforcersPrefix = "/allot/enforcers/"
	// ElectionPrefix is where the balancer replicas campaign (a concurrency.Election): the
	// leader is the value of the key created first under ElectionPrefix + "/", and that
	// key's create revision is the term's fencing token.
	ElectionPrefix = "/allot/balancer/election"
	// SharesPrefix is where the leader publishes share sets and enforcers watch them
	// (<prefix>head, <prefix>chunk/<i>; see Head).
	SharesPrefix = "/allot/shares/"
	// AuditPrefix holds the admin API's audit records.
	AuditPrefix = "/allot/admin/audit/"
	// ChangeKey is bumped by every admin change (the dashboards' "last changed").
	ChangeKey = "/allot/admin/changed"
)

// AggregatorPrefix is where each region's report aggregators (pkg/aggregator) campaign:
// AggregatorElection(AggregatorPrefix, region).
const AggregatorPrefix = "/allot/aggregator/"

// AggregatorElection is region's aggregator election under prefix (AggregatorPrefix when
// empty): the elected aggregator's address is read with Leader, as the balancer's.
func AggregatorElection(prefix, region string) string {
	if prefix == "" {
		prefix = AggregatorPrefix
	}
	return strings.TrimSuffix(prefix, "/") + "/" + region + "/election"
}
