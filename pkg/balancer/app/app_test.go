package app

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/certs"
	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/allot-dev/allot/pkg/testenv/poll"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

var configFile = filepath.Join("..", "..", "..", "configs", "balancer.yaml")
var rulesFile = filepath.Join("..", "..", "..", "configs", "rules", "example.yaml")

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseConfigFileEnvAndFlags(t *testing.T) {
	var out bytes.Buffer
	cfg, err := Parse([]string{"-config", configFile, "-interval", "5s", "-weights", "us-east=2"},
		env(map[string]string{"ALLOT_INTERVAL": "7s", "ALLOT_KEY_TTL": "2m", "ALLOT_ETCD_ENDPOINTS": "http://a:1, http://b:2"}), &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if cfg.Balance.Interval != 5*time.Second || cfg.Balance.KeyTTL != 2*time.Minute || len(cfg.Etcd.Endpoints) != 2 {
		t.Fatalf("interval %v key_ttl %v endpoints %v: flags over env over file", cfg.Balance.Interval, cfg.Balance.KeyTTL, cfg.Etcd.Endpoints)
	}
	if w := cfg.weights(); w[0] != 2 || w[1] != 1 || cfg.Regions[2] != "ap-south" {
		t.Fatalf("weights %v regions %v", w, cfg.Regions)
	}
	if cc := cfg.coreConfig(); cc.Stale != 5*time.Minute || cc.Share.Floor != 0.01 || cc.MaxPublished != 50000 {
		t.Fatalf("core config %+v", cc)
	}
}

func TestParseNamesBadValues(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-config", configFile, "-regions", ""}, "regions is empty"},
		{[]string{"-config", configFile, "-weights", "mars=1"}, `weights names region "mars"`},
		{[]string{"-config", configFile, "-interval", "0s"}, "Interval 0s, must be > 0"},
		{[]string{"-config", configFile, "-session-ttl", "1500ms"}, "SessionTTL 1.5s"},
		{[]string{"-config", configFile, "-log-level", "loud"}, `log_level "loud"`},
		{[]string{"-config", configFile, "-weights", "us-east"}, "want region=weight"},
	} {
		_, err := Parse(tc.args, env(nil), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one naming %q", tc.args, err, tc.want)
		}
	}
}

// TestParseTracing: tracing follows the OTEL_* variables, off without an exporter, and a
// value allot cannot honour is a config error naming the variable.
func TestParseTracing(t *testing.T) {
	args := []string{"-config", configFile}
	cfg, err := Parse(args, env(nil), io.Discard)
	if err != nil || cfg.Tracing.Enabled {
		t.Fatalf("no OTEL_* variables: tracing %+v, %v; want off", cfg.Tracing, err)
	}
	cfg, err = Parse(args, env(map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SERVICE_NAME": "quota"}), io.Discard)
	if err != nil || !cfg.Tracing.Enabled || cfg.Tracing.ServiceName != "quota" {
		t.Fatalf("tracing %+v, %v", cfg.Tracing, err)
	}
	_, err = Parse(args, env(map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}), io.Discard)
	if err == nil || !strings.Contains(err.Error(), `OTEL_EXPORTER_OTLP_PROTOCOL "http/protobuf"`) {
		t.Fatalf("http/protobuf: %v, want an error naming the variable", err)
	}
}

// TestAppLeadsPublishesAndResigns runs one replica against real etcd: it leads, takes a
// report over gRPC, publishes a share set, serves /metrics and /readyz, and resigns on
// Close.
func TestAppLeadsPublishesAndResigns(t *testing.T) {
	e := testenv.Etcd(t, 1)
	f := testenv.Certs(t, "", "us-east", "eu-west", "ap-south")
	dashTokens := filepath.Join(t.TempDir(), "dashboard-tokens")
	const dashSecret = "noc-secret-0123456789"
	if err := os.WriteFile(dashTokens, []byte("noc:"+dashSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, cfg, stop := startLeader(t, e.Endpoints(), f, "-dashboard-tokens-file", dashTokens)

	// Each region reports with its own enforcers' certificate.
	bcs := map[string]allotv1.BalancerClient{}
	for _, region := range cfg.Regions {
		bcs[region] = reportClient(t, a.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(testenv.EnforcerTLS(t, f, region))))
	}
	cli := e.Client(t)
	var head contract.Head
	seq := uint64(0)
	poll.True(t, 15*time.Second, "the busy key published", func() bool {
		seq++
		now := time.Now()
		for _, region := range cfg.Regions {
			rate := 0.0
			if region == "eu-west" {
				rate = 200
			}
			rq := &allotv1.ReportRequest{Region: region, EnforcerId: "e1", Seq: seq, IntervalStartMs: now.Add(-time.Second).UnixMilli(),
				IntervalEndMs: now.UnixMilli(), Usage: []*allotv1.IdentityUsage{{Rule: "default", Identity: "key:k1", Admitted: rate}}}
			resp, err := bcs[region].Report(context.Background(), rq)
			if err != nil || !resp.Accepted {
				t.Fatalf("report: %v %v", resp, err)
			}
		}
		r, err := cli.Get(context.Background(), contract.HeadKey(contract.SharesPrefix))
		if err != nil || len(r.Kvs) == 0 {
			return false
		}
		head, _ = contract.DecodeHead(r.Kvs[0].Value)
		return head.Version >= 1
	})
	for path, want := range map[string]string{"/readyz": "ready: leader", "/healthz": "ok",
		"/metrics": "allot_balancer_leader 1", "/dashboard/": "LEADER", "/": "eu-west"} {
		resp, err := http.Get("http://" + a.HTTPAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), want) {
			t.Fatalf("%s: %d %q, want %q", path, resp.StatusCode, b, want)
		}
	}
	// Issue 27 §4: the dashboard names key:k1 only to a viewer token (dashboard.tokens_file).
	dash := func(auth string) (int, string) {
		req, _ := http.NewRequest("GET", "http://"+a.HTTPAddr()+"/dashboard/", nil)
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	poll.True(t, 10*time.Second, "key:k1 on the dashboard, with the token", func() bool {
		code, page := dash(dashSecret)
		return code == 200 && strings.Contains(page, "key:k1")
	})
	if code, page := dash(""); code != 200 || strings.Contains(page, "key:k1") || !strings.Contains(page, "Identities are masked") {
		t.Errorf("dashboard without a token: %d, shows key:k1 %v, says masked %v; want 200, masked", code,
			strings.Contains(page, "key:k1"), strings.Contains(page, "Identities are masked"))
	}
	if code, _ := dash("wrong-secret-0123456789"); code != http.StatusUnauthorized {
		t.Errorf("dashboard with a wrong token: %d, want 401", code)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	r, err := cli.Get(context.Background(), cfg.Etcd.ElectionPrefix+"/", clientv3.WithPrefix())
	if err != nil || len(r.Kvs) != 0 {
		t.Fatalf("after Close: election keys %v (%v), want none (resigned)", r.Kvs, err)
	}
}

// tlsArgs are the flags giving a replica the report API's mutual TLS with f's
// certificates (configs/balancer.yaml names bin/certs, which tests do not make).
func tlsArgs(f certs.Files) []string {
	return []string{"-tls", "-tls-cert", f.Balancer(), "-tls-key", f.BalancerKey(), "-tls-client-ca", f.CA()}
}

// reportClient is a Balancer client of addr, closed at the test's end.
func reportClient(t *testing.T, addr string, creds grpc.DialOption) allotv1.BalancerClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, creds)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return allotv1.NewBalancerClient(cc)
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// startLeader runs one replica with the test config on etcd endpoints and the certificates
// f (and any further flags), returns it and its config once it leads, and a stop that
// cancels it and returns Run's error (once; the test's end calls it too).
func startLeader(t *testing.T, endpoints []string, f certs.Files, extra ...string) (_ *App, _ Config, stop func() error) {
	t.Helper()
	args := append([]string{"-config", configFile, "-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0",
		"-etcd-endpoints", strings.Join(endpoints, ","), "-rules-file", rulesFile, "-rules-etcd-prefix", "",
		"-interval", "1s", "-learning", "1s", "-session-ttl", "2s"}, extra...)
	cfg, err := Parse(append(args, tlsArgs(f)...), env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(cfg, hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: testWriter{t}}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	var runErr error
	stop = func() error { once.Do(func() { cancel(); runErr = <-done }); return runErr }
	t.Cleanup(func() { stop() })
	poll.True(t, 10*time.Second, "leading", func() bool { ok, _ := a.Service().Leading(); return ok })
	return a, cfg, stop
}
