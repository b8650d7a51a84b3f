package stack

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/certs"
	"github.com/allot-dev/allot/pkg/testenv"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"gopkg.in/yaml.v3"
)

// Enforcer is one bin/enforcer process of the stack.
type Enforcer struct {
	ID, Region string
	GRPC, HTTP string // 127.0.0.1:port
	Proc       *testenv.Proc
	// BalancerLinks are its own paths to the balancer replicas (Options.EnforcerLinks;
	// empty otherwise: it reports over its region's).
	BalancerLinks []*testenv.Link

	mu   sync.Mutex // mu guards conn
	conn *grpc.ClientConn
}

// enforcerConfig is the region's config file: the shape of configs/regions/*.yaml with the
// stack's addresses; every region of the stack enforces the global limits with equal
// weight (a third each of three). refuse403 is the README's nginx setting (auth_request takes only
// 2xx/401/403). extra is YAML merged over it.
func enforcerConfig(t testing.TB, r *Region, regions []string, rulesFile string, cf certs.Files, refuse403 bool, opt Options, balancerAddrs []string) string {
	t.Helper()
	status := 429
	if refuse403 {
		status = 403
	}
	cfg := map[string]any{
		"region":  r.Name,
		"regions": regions,
		"store": map[string]any{
			"kind": "redis-cluster", "addrs": r.Redis.Addrs(), "key_prefix": "allot:",
			"dial_timeout": "1s", "read_timeout": "100ms", "write_timeout": "100ms",
		},
		"etcd": map[string]any{
			"endpoints": r.EtcdEndpoints, "registry_prefix": "/allot/enforcers/",
			"registration_ttl": "5s", "start_timeout": "10s", "dial_timeout": "2s",
		},
		"rules":  map[string]any{"file": rulesFile, "etcd_prefix": "/allot/rules/", "ipv6_prefix": 64},
		"shares": map[string]any{"etcd_prefix": "/allot/shares/", "stale_after": opt.ShareStale.String()},
		// Usage reports go to the balancer's leader once one runs; until then they are
		// dropped, which costs checks nothing (configs/regions/*.yaml).
		// Over mutual TLS with the region's own certificate (configs/regions/*.yaml).
		"balancer": map[string]any{"enabled": true, "election_prefix": "/allot/balancer/election", "interval": opt.BalanceInterval.String(),
			"tls": map[string]any{"enabled": true, "ca_file": cf.CA(), "cert_file": cf.Enforcer(r.Name), "key_file": cf.EnforcerKey(r.Name)}},
		"lease": map[string]any{"ttl": "1s", "window": "100ms", "busy_hits": 3, "max_keys": 65536},
		"fallback": map[string]any{
			"timeout": opt.FallbackTimeout.String(), "reply_timeout": "100ms", "probe_timeout": "100ms",
			"trip_after": 5, "open_for": "2s", "max_in_flight": 256, "slack": 2, "max_local_keys": 100000,
		},
		"check":         map[string]any{"max_descriptors": 8, "max_value_len": 256, "max_hits": 1000, "reset_jitter_max": "1s", "refusal_log_every": 100},
		"forward_auth":  map[string]any{"api_key_header": "X-Api-Key", "trusted_hops": 1, "refuse_status": status},
		"drain_timeout": "5s",
		"log_level":     "info",
	}
	if opt.Aggregate {
		cfg["balancer"].(map[string]any)["via_aggregator"] = true // the region's aggregator, found in etcd
	} else if len(balancerAddrs) > 0 {
		// This region (or enforcer) reaches the replicas through its own links, not at the
		// address the leader advertises in etcd.
		cfg["balancer"].(map[string]any)["addrs"] = balancerAddrs
	}
	if opt.Enforcer != "" {
		var over map[string]any
		if err := yaml.Unmarshal([]byte(opt.Enforcer), &over); err != nil {
			t.Fatalf("stack: Options.Enforcer: %v", err)
		}
		merge(cfg, over)
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// merge writes over into dst, recursing into maps.
func merge(dst, over map[string]any) {
	for k, v := range over {
		if vm, ok := v.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				merge(dm, vm)
				continue
			}
		}
		dst[k] = v
	}
}

func (s *Stack) startEnforcer(t testing.TB, r *Region, i int) *Enforcer {
	t.Helper()
	p := testenv.Ports(t, 2)
	e := &Enforcer{
		ID: fmt.Sprintf("%s-%d", r.Name, i+1), Region: r.Name,
		GRPC: "127.0.0.1:" + strconv.Itoa(p[0]), HTTP: "127.0.0.1:" + strconv.Itoa(p[1]),
	}
	config := r.config
	if s.opt.EnforcerLinks && r != s.Regions[0] {
		// Links of its own to every replica, in a config of its own.
		var addrs []string
		for j, b := range s.Balancers {
			k := s.Links.Add(t, fmt.Sprintf("%s-balancer-%d", e.ID, j), b.GRPC, r.latency, s.opt.Jitter)
			e.BalancerLinks = append(e.BalancerLinks, k)
			addrs = append(addrs, k.Addr)
		}
		config = filepath.Join(s.Dir, e.ID+".yaml")
		writeFile(t, config, enforcerConfig(t, r, s.names, s.RulesFile, s.Certs, false, s.opt, addrs))
	}
	e.Proc = testenv.Run(t, testenv.ProcOptions{
		Kind: "enforcer", Image: s.Image,
		Argv:  []string{"enforcer", "-config", config, "-id", e.ID, "-grpc-addr", e.GRPC, "-http-addr", e.HTTP},
		Binds: []string{s.Dir + ":" + s.Dir + ":ro"},
	})
	t.Cleanup(e.closeConn)
	e.WaitReady(t, time.Minute)
	return e
}

// StartEnforcer starts one more enforcer process in region r, with the region's config,
// id "<region>-<n>" and ports of its own, and returns once its /readyz answers 200: the
// new instance of a rolling restart. It is not added to r.Enforcers.
func (s *Stack) StartEnforcer(t testing.TB, r *Region, n int) *Enforcer {
	t.Helper()
	e := s.startEnforcer(t, r, n-1)
	r.BalancerLinks = append(r.BalancerLinks, e.BalancerLinks...)
	return e
}

// WaitReady polls /readyz until it answers 200.
func (e *Enforcer) WaitReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	e.Proc.WaitReady(t, "enforcer "+e.ID+" /readyz", timeout, func(ctx context.Context) error {
		code, body, err := e.Get(ctx, "/readyz")
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("/readyz %d: %s", code, body)
		}
		return nil
	})
}

// WaitPeers polls until the enforcer counts n live enforcers in its region.
func (e *Enforcer) WaitPeers(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	e.Proc.WaitReady(t, fmt.Sprintf("enforcer %s counting %d peers", e.ID, n), timeout, func(ctx context.Context) error {
		m, err := e.Metrics(ctx)
		if err != nil {
			return err
		}
		if got := m.Sum("allot_registry_peers", ""); got != float64(n) {
			return fmt.Errorf("allot_registry_peers %v, want %d", got, n)
		}
		return nil
	})
}

var httpc = &http.Client{Timeout: 5 * time.Second}

// Get fetches path from the enforcer's HTTP address.
func (e *Enforcer) Get(ctx context.Context, path string) (int, string, error) {
	return get(ctx, e.HTTP, path)
}

func get(ctx context.Context, addr, path string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+addr+path, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := httpc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return resp.StatusCode, string(b), err
}

// Client is the enforcer's allot.v1 gRPC client over one connection, made on first use
// and closed at the stack's cleanup.
func (e *Enforcer) Client(t testing.TB) allotv1.AllotClient {
	return allotv1.NewAllotClient(e.Conn(t))
}

// Conn is the enforcer's gRPC connection (see Client).
func (e *Enforcer) Conn(t testing.TB) *grpc.ClientConn {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.conn == nil {
		cc, err := grpc.NewClient(e.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatalf("stack: gRPC client for %s: %v", e.ID, err)
		}
		e.conn = cc
	}
	return e.conn
}

func (e *Enforcer) closeConn() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.conn != nil {
		_ = e.conn.Close()
		e.conn = nil
	}
}

// Check asks the enforcer over gRPC, with a timeout of 2 s.
func (e *Enforcer) Check(t testing.TB, ctx context.Context, req *allotv1.CheckRequest) (*allotv1.CheckResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return e.Client(t).Check(ctx, req)
}

// Metrics are one scrape of /metrics: series (name{labels} as exposed) → value.
type Metrics map[string]float64

// Metrics scrapes the enforcer's /metrics.
func (e *Enforcer) Metrics(ctx context.Context) (Metrics, error) { return scrape(ctx, e.HTTP) }

func scrape(ctx context.Context, addr string) (Metrics, error) {
	code, body, err := get(ctx, addr, "/metrics")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("/metrics %d", code)
	}
	m := Metrics{}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		m[line[:i]] = v
	}
	return m, sc.Err()
}

// MustMetrics is Metrics failing t on error.
func (e *Enforcer) MustMetrics(t testing.TB) Metrics {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := e.Metrics(ctx)
	if err != nil {
		t.Fatalf("stack: %s /metrics: %v", e.ID, err)
	}
	return m
}

// Sum adds the series of metric name whose labels contain every one of the comma-free
// label matchers in with (e.g. `source="fallback"`); "" matches all.
func (m Metrics) Sum(name string, with ...string) float64 {
	var sum float64
	for series, v := range m {
		base, labels, _ := strings.Cut(series, "{")
		if base != name {
			continue
		}
		ok := true
		for _, w := range with {
			if w != "" && !strings.Contains(labels, w) {
				ok = false
			}
		}
		if ok {
			sum += v
		}
	}
	return sum
}

// Labels returns the value of label key in every series of name (with matchers as Sum),
// mapped to the series' value.
func (m Metrics) Labels(name, key string, with ...string) map[string]float64 {
	out := map[string]float64{}
	for series, v := range m {
		base, labels, _ := strings.Cut(series, "{")
		if base != name {
			continue
		}
		ok := true
		for _, w := range with {
			if w != "" && !strings.Contains(labels, w) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		for _, kv := range strings.Split(strings.TrimSuffix(labels, "}"), ",") {
			if k, val, found := strings.Cut(kv, "="); found && k == key {
				out[strings.Trim(val, `"`)] += v
			}
		}
	}
	return out
}
