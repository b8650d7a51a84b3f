package report

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allot-dev/allot/pkg/contract"
)

// ErrNoLeader is returned (wrapped) when no balancer leader is known.
var ErrNoLeader = contract.ErrNoLeader

// LeaderSource names the balancer leader's report address ("host:port"). Implementations
// must be safe for concurrent use and honour ctx.
type LeaderSource interface {
	Leader(ctx context.Context) (string, error)
}

// EtcdLeader reads the leader from the balancer's election on prefix (contract.Leader; an
// empty prefix means contract.ElectionPrefix). It needs no session (a plain read).
func EtcdLeader(cli *clientv3.Client, prefix string) LeaderSource {
	return etcdLeader{cli: cli, prefix: prefix}
}

type etcdLeader struct {
	cli    *clientv3.Client
	prefix string
}

func (l etcdLeader) Leader(ctx context.Context) (string, error) {
	addr, _, err := contract.Leader(ctx, l.cli, l.prefix)
	return addr, err
}

// StaticLeader always names addr (one balancer, or tests).
func StaticLeader(addr string) LeaderSource { return staticLeader(addr) }

type staticLeader string

func (s staticLeader) Leader(context.Context) (string, error) {
	if s == "" {
		return "", ErrNoLeader
	}
	return string(s), nil
}
