package app

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/registry"
	"github.com/allot-dev/allot/pkg/testenv"
)

// TestExplainOverRedis: an enforcer on Redis with explain on registers its HTTP address
// and answers GET /v1/explain with the bucket's level read from Redis (under the fallback
// → lease stack) and the key's recent takes; without a token it refuses.
func TestExplainOverRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Redis and etcd containers")
	}
	node, etcd := testenv.Redis(t), testenv.Etcd(t, 1)
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte("rules:\n  - id: default\n    limits: [{name: minute, rate: 60, per: 1m}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("ops:ops-secret-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Region, cfg.ID, cfg.Rules.File = "us-east", "e1", rulesPath
	cfg.Store.Kind, cfg.Store.Addrs, cfg.Store.KeyPrefix = "redis", []string{node.Addr}, "explain:"
	cfg.Etcd.Endpoints = etcd.Endpoints()
	cfg.Listen.GRPC, cfg.Listen.HTTP = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Explain = ExplainConfig{Enabled: true, TokensFile: tokens}
	a, _ := start(t, cfg)

	resp, err := etcd.Client(t).Get(context.Background(), "/allot/enforcers/us-east/e1")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("registration: %v %v", resp, err)
	}
	var m registry.Member
	if err := json.Unmarshal(resp.Kvs[0].Value, &m); err != nil || m.HTTPAddr != a.HTTPAddr() {
		t.Fatalf("registered %s, want http_addr %s", resp.Kvs[0].Value, a.HTTPAddr())
	}
	for range 5 {
		if code, _, _ := httpCheck(t, a.HTTPAddr(), `{"api_key":"k1"}`); code != 200 {
			t.Fatalf("check: %d", code)
		}
	}
	get := func(token string) (int, []byte) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+a.HTTPAddr()+"/v1/explain?api_key=k1", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		r, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return r.StatusCode, b
	}
	if code, b := get(""); code != http.StatusUnauthorized {
		t.Fatalf("no token: %d %s", code, b)
	}
	code, b := get("ops-secret-0123456789")
	var x enforcer.Explanation
	if code != 200 || json.Unmarshal(b, &x) != nil || len(x.Rules) != 1 {
		t.Fatalf("%d %s", code, b)
	}
	re := x.Rules[0]
	// 60 a minute, burst 60: the five checks (or a lease batch) came out of Redis.
	if l := re.Limits[0]; l.Level == nil || *l.Level >= 56 || *l.Level < 0 {
		t.Fatalf("level %+v, want below 56 (5 taken from 60)", l)
	}
	if len(re.Recent) != 5 || !strings.Contains("redis lease", re.Recent[0].Source) {
		t.Fatalf("recent %+v", re.Recent)
	}
}

// TestExplainOffSaysWhatToTurnOn (issue 28, item 3): with explain off (the default),
// /v1/explain answers 404 naming the config field and the flag that turn it on, not "404
// page not found"; -explain and -explain-tokens-file turn it on.
func TestExplainOffSaysWhatToTurnOn(t *testing.T) {
	a, _ := memoryApp(t, fileRules)
	resp, err := http.Get("http://" + a.HTTPAddr() + "/v1/explain?api_key=k1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "explain.enabled: true") || !strings.Contains(string(body), "-explain") {
		t.Fatalf("explain off: %d %s, want 404 naming explain.enabled and -explain", resp.StatusCode, body)
	}
	cfg, err := Parse([]string{"-region", "r", "-rules-file", "r", "-explain", "-explain-tokens-file", "/etc/tokens"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Explain.Enabled || cfg.Explain.TokensFile != "/etc/tokens" {
		t.Fatalf("-explain -explain-tokens-file: %+v", cfg.Explain)
	}
	for _, r := range []string{"us-east", "eu-west", "ap-south"} {
		cfg, err := Parse([]string{"-config", "../../../configs/regions/" + r + ".yaml", "-explain", "-explain-tokens-file", "/etc/tokens"}, env(nil), io.Discard)
		if err != nil || !cfg.Explain.Enabled {
			t.Fatalf("%s with -explain: %v %+v", r, err, cfg.Explain)
		}
	}
}
