package stack

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/testenv"
	clientv3 "go.etcd.io/etcd/client/v3"
	"gopkg.in/yaml.v3"
)

// Balancer is one bin/balancer replica of the stack (in the first region, next to etcd).
type Balancer struct {
	ID         string
	GRPC, HTTP string
	Proc       *testenv.Proc
}

// balancerConfig is configs/balancer.yaml's shape with the stack's addresses; extra is
// YAML merged over it.
func balancerConfig(t testing.TB, s *Stack, regions []string, opt Options) string {
	t.Helper()
	cfg := map[string]any{
		"regions": regions,
		"weights": map[string]any{},
		"etcd": map[string]any{
			"endpoints": s.Etcd.Endpoints(), "dial_timeout": "2s",
			"election_prefix": "/allot/balancer/election", "shares_prefix": "/allot/shares/",
			"session_ttl": fmt.Sprintf("%ds", int(opt.SessionTTL.Seconds())), "write_timeout": "5s",
		},
		"rules": map[string]any{"file": s.RulesFile, "etcd_prefix": "/allot/rules/", "poll_interval": "2s", "ipv6_prefix": 64},
		"balance": map[string]any{
			"interval": opt.BalanceInterval.String(), "early_gap": "1s", "learning": (2 * opt.BalanceInterval).String(),
			"ack_timeout": "3s", "min_version_gap": "1s", "silent_after": (4 * opt.BalanceInterval).String(),
			"stale": opt.ShareStale.String(), "key_ttl": "1m", "tick_every": "500ms",
		},
		// Reports need mutual TLS and the region's certificate (configs/balancer.yaml).
		"listen": map[string]any{"tls": map[string]any{"enabled": true, "cert_file": s.Certs.Balancer(),
			"key_file": s.Certs.BalancerKey(), "client_ca_file": s.Certs.CA()}},
		"drain_timeout": "5s",
		"log_level":     "info",
	}
	if opt.AdminToken != "" {
		cfg["admin"] = map[string]any{"enabled": true, "tokens_file": adminTokensFile(s), "tokens_env": ""}
	}
	if opt.Balancer != "" {
		var over map[string]any
		if err := yaml.Unmarshal([]byte(opt.Balancer), &over); err != nil {
			t.Fatalf("stack: Options.Balancer: %v", err)
		}
		merge(cfg, over)
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// aggregatorConfig is region r's report aggregator: the balancers' config with r's etcd
// endpoints (its links) and an aggregate section forwarding with r's certificate, to the
// replicas through r's balancer links when it has them.
func aggregatorConfig(t testing.TB, s *Stack, r *Region, regions []string, opt Options) string {
	t.Helper()
	var cfg map[string]any
	if err := yaml.Unmarshal([]byte(balancerConfig(t, s, regions, opt)), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["etcd"].(map[string]any)["endpoints"] = r.EtcdEndpoints
	delete(cfg, "admin")
	cfg["aggregate"] = map[string]any{"region": r.Name, "upstream_tls": map[string]any{"enabled": true,
		"ca_file": s.Certs.CA(), "cert_file": s.Certs.Enforcer(r.Name), "key_file": s.Certs.EnforcerKey(r.Name)}}
	if len(r.BalancerAddrs) > 0 {
		// The region reaches the replicas through its own links, so that a drill can cut
		// its report path (region-cut).
		cfg["aggregate"].(map[string]any)["upstream_addrs"] = r.BalancerAddrs
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// newBalancer names replica i and picks its ports (it is started by startBalancer).
func newBalancer(t testing.TB, i int) *Balancer {
	t.Helper()
	p := testenv.Ports(t, 2)
	return &Balancer{ID: fmt.Sprintf("bal-%d", i+1), GRPC: "127.0.0.1:" + strconv.Itoa(p[0]), HTTP: "127.0.0.1:" + strconv.Itoa(p[1])}
}

func (s *Stack) startBalancer(t testing.TB, conf string, b *Balancer) {
	t.Helper()
	b.Proc = testenv.Run(t, testenv.ProcOptions{
		Kind: "balancer", Image: s.Image,
		Argv:  []string{"balancer", "-config", conf, "-id", b.ID, "-grpc-addr", b.GRPC, "-http-addr", b.HTTP},
		Binds: []string{s.Dir + ":" + s.Dir + ":ro"},
	})
	b.WaitReady(t, time.Minute)
}

// WaitReady polls the replica's /readyz until 200.
func (b *Balancer) WaitReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	b.Proc.WaitReady(t, "balancer "+b.ID+" /readyz", timeout, func(ctx context.Context) error {
		code, body, err := get(ctx, b.HTTP, "/readyz")
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("/readyz %d: %s", code, body)
		}
		return nil
	})
}

// Metrics scrapes the replica's /metrics.
func (b *Balancer) Metrics(ctx context.Context) (Metrics, error) { return scrape(ctx, b.HTTP) }

// Leader returns the replica that reports allot_balancer_leader 1, polling until one does
// (or timeout; then it fails t).
func (s *Stack) Leader(t testing.TB, timeout time.Duration) *Balancer {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		for _, b := range s.Balancers {
			if !b.Proc.Status(t).Running {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			m, err := b.Metrics(ctx)
			cancel()
			if err == nil && m.Sum("allot_balancer_leader") == 1 {
				return b
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("stack: no balancer replica leads after %v", timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ShareSet reads the published share set from etcd: the head and every entry of its
// chunks (only chunks of the head's version and leader are taken).
func ShareSet(ctx context.Context, cli *clientv3.Client) (contract.Head, []contract.Entry, error) {
	resp, err := cli.Get(ctx, "/allot/shares/", clientv3.WithPrefix())
	if err != nil {
		return contract.Head{}, nil, err
	}
	var head contract.Head
	var chunks []contract.Chunk
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		if k == contract.HeadKey("/allot/shares/") {
			if head, err = contract.DecodeHead(kv.Value); err != nil {
				return head, nil, err
			}
		} else if strings.HasPrefix(k, "/allot/shares/chunk/") {
			c, err := contract.DecodeChunk(kv.Value)
			if err != nil {
				return head, nil, err
			}
			chunks = append(chunks, c)
		}
	}
	var entries []contract.Entry
	for _, c := range chunks {
		if c.Version == head.Version && c.LeaderRev == head.LeaderRev {
			entries = append(entries, c.Entries...)
		}
	}
	return head, entries, nil
}

func balancerConfigFile(s *Stack) string { return filepath.Join(s.Dir, "balancer.yaml") }

func adminTokensFile(s *Stack) string { return filepath.Join(s.Dir, "admin-tokens") }
