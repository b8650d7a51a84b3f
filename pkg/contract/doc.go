// Package contract is what allot's processes agree on, kept in one place so that the
// enforcers, the quota balancer, the admin API and the tests cannot drift apart:
//
//   - the etcd keyspace (keyspace.go): where rules, enforcer registrations, the balancer
//     election, the published shares and the admin audit live;
//   - the balancer election and the leader lookup every process uses to find the leader
//     (leader.go);
//   - the share-set format the balancer publishes and every enforcer watches (shareset.go,
//     chunker.go);
//   - the region weights of the default split, in the one syntax the enforcers and the
//     balancer both read (regions.go).
//
// The gRPC API between gateways, enforcers and the balancer is the other half of the
// contract and lives in proto/allot/v1. This package imports nothing of allot's.
package contract
