package report

import (
	"context"
	"errors"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrNoLeader is returned (wrapped) when no balancer leader is known.
var ErrNoLeader = errors.New("usage: no balancer leader")

// DefaultElectionPrefix is the balancer's concurrency.Election prefix.
const DefaultElectionPrefix = "/allot/balancer/election"

// LeaderSource names the balancer leader's report address ("host:port"). Implementations
// must be safe for concurrent use and honour ctx.
type LeaderSource interface {
	Leader(ctx context.Context) (string, error)
}

// EtcdLeader reads the leader from an etcd concurrency.Election on prefix: the value of
// the key created first under prefix + "/", which is what Election.Leader returns. It
// needs no session (a plain read). An empty prefix means DefaultElectionPrefix.
func EtcdLeader(cli *clientv3.Client, prefix string) LeaderSource {
	if prefix == "" {
		prefix = DefaultElectionPrefix
	}
	return etcdLeader{cli: cli, prefix: strings.TrimSuffix(prefix, "/") + "/"}
}

type etcdLeader struct {
	cli    *clientv3.Client
	prefix string
}

func (l etcdLeader) Leader(ctx context.Context) (string, error) {
	resp, err := l.cli.Get(ctx, l.prefix, clientv3.WithFirstCreate()...)
	if err != nil {
		return "", fmt.Errorf("while reading the balancer election %q: %w", l.prefix, err)
	}
	if len(resp.Kvs) == 0 || len(resp.Kvs[0].Value) == 0 {
		return "", fmt.Errorf("%w: election %q is empty", ErrNoLeader, l.prefix)
	}
	return string(resp.Kvs[0].Value), nil
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
