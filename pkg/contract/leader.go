package contract

import (
	"context"
	"errors"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrNoLeader is returned (wrapped) when no balancer leader is known.
var ErrNoLeader = errors.New("no balancer leader")

// Leader reads the balancer leader from the election on prefix (ElectionPrefix when
// empty): the value of the key created first under prefix + "/" — what
// concurrency.Election.Leader returns, read without a session — and that key's create
// revision, the leader's fencing token. An empty election is ErrNoLeader.
func Leader(ctx context.Context, cli *clientv3.Client, prefix string) (addr string, rev int64, err error) {
	if prefix == "" {
		prefix = ElectionPrefix
	}
	prefix = strings.TrimSuffix(prefix, "/") + "/"
	resp, err := cli.Get(ctx, prefix, clientv3.WithFirstCreate()...)
	if err != nil {
		return "", 0, fmt.Errorf("while reading the balancer election %q: %w", prefix, err)
	}
	if len(resp.Kvs) == 0 || len(resp.Kvs[0].Value) == 0 {
		return "", 0, fmt.Errorf("%w: election %q is empty", ErrNoLeader, prefix)
	}
	return string(resp.Kvs[0].Value), resp.Kvs[0].CreateRevision, nil
}
