package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/balancer/admin"
	"github.com/allot-dev/allot/pkg/balancer/app"
	"github.com/allot-dev/allot/pkg/enforcer"
)

// runCLI runs an admin command with env as the environment.
func runCLI(env map[string]string, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := cli(args, cliEnv{getenv: func(k string) string { return env[k] }, stdout: &out, stderr: &errb})
	return code, out.String(), errb.String()
}

// TestCLIRulesCheckIsLocal (issue 28, item 3): `rules check -f` writes nothing, so it needs
// no balancer and no token: it checks the file here, as an enforcer would.
func TestCLIRulesCheckIsLocal(t *testing.T) {
	env := map[string]string{"ALLOT_ADMIN_ADDR": "127.0.0.1:1"} // nothing listens; no token
	code, out, errOut := runCLI(env, "rules", "check", "-f", filepath.Join("..", "..", "configs", "rules", "example.yaml"))
	if code != 0 || !strings.Contains(out, "ok,") {
		t.Fatalf("example rules: exit %d\n%s%s", code, out, errOut)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	write(t, bad, "rules:\n  - id: default\n    limits: [{name: second, rate: 20, per: 1s}]\n  - id: broken\n    limits: [{name: second, rate: 0, per: 1s}]\n")
	code, out, errOut = runCLI(env, "rules", "check", "-f", bad)
	if code != 1 || !strings.Contains(errOut, bad+`:5: rule "broken": limits[0].rate`) {
		t.Fatalf("bad rules: exit %d, want 1 naming file, line, rule and field\n%s%s", code, out, errOut)
	}
	if code, _, _ = runCLI(env, "rules", "check"); code != 2 {
		t.Fatalf("no -f: exit %d, want 2", code)
	}
}

// TestCLITokenFile (issue 28, item 3): -token-file takes the secret alone or the
// balancer's tokens file (name:secret lines, comments), picking with -token-name when it
// holds several, and says what is wrong otherwise — never sending a line break in a
// header.
func TestCLITokenFile(t *testing.T) {
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Header.Get("Authorization"))
		_ = json.NewEncoder(w).Encode(admin.RulesResponse{Revision: 7})
	}))
	defer srv.Close()
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content string
		args          []string
		code          int
		want          string // the bearer secret sent, or the error printed
	}{
		{"secret alone", "s3cret-0123456789abc\n", nil, 0, "s3cret-0123456789abc"},
		{"tokens file, one", "# admin tokens\nalice:s3cret-0123456789abc\n\n", nil, 0, "s3cret-0123456789abc"},
		{"tokens file, picked", "alice:a-0123456789abcdef\nbob:b-0123456789abcdef\n", []string{"-token-name", "bob"}, 0, "b-0123456789abcdef"},
		{"tokens file, several", "alice:a-0123456789abcdef\nbob:b-0123456789abcdef\n", nil, 2, "holds 2 tokens (alice, bob): pick one with -token-name"},
		{"tokens file, no such name", "alice:a-0123456789abcdef\n", []string{"-token-name", "carol"}, 2, `no token named "carol" (it has: alice)`},
		{"empty", "# nothing\n", nil, 2, "holds no token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_"))
			write(t, f, tc.content)
			got.Store("")
			args := append([]string{"rules", "list", "-addr", srv.URL, "-token-file", f}, tc.args...)
			code, out, errOut := runCLI(nil, args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\n%s%s", code, tc.code, out, errOut)
			}
			if tc.code == 0 {
				if g := got.Load().(string); g != "Bearer "+tc.want {
					t.Fatalf("sent %q, want the bearer %q", g, tc.want)
				}
				return
			}
			if !strings.Contains(errOut, tc.want) || strings.Contains(errOut, "0123456789") {
				t.Fatalf("stderr %q, want %q and no secret", errOut, tc.want)
			}
		})
	}
}

// TestCLIFailuresSayWhy (issue 28, item 3): a balancer with the admin API off, something
// else at -addr, and enforcers with explain off all exit 1 with what to turn on.
func TestCLIFailuresSayWhy(t *testing.T) {
	off := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(admin.ErrorResponse{Error: app.AdminOff})
	}))
	defer off.Close()
	bare := httptest.NewServer(http.NotFoundHandler())
	defer bare.Close()
	env := map[string]string{"ALLOT_ADMIN_TOKEN": "s3cret-0123456789abc"}
	for _, tc := range []struct{ addr, want string }{{off.URL, "admin.enabled: true"}, {bare.URL, "no admin API at this address"}} {
		for _, args := range [][]string{{"rules", "list"}, {"shares", "k1"}, {"audit"}, {"explain", "k1"}} {
			code, out, errOut := runCLI(env, append(args, "-addr", tc.addr)...)
			if code != 1 || !strings.Contains(errOut, tc.want) || strings.Contains(out+errOut, "404 page not found") {
				t.Fatalf("%v at %s: exit %d, want 1 with %q\n%s%s", args, tc.addr, code, tc.want, out, errOut)
			}
		}
	}

	// Nothing listening at -addr.
	code, out, errOut := runCLI(env, "rules", "list", "-addr", "127.0.0.1:1")
	if code != 1 || !strings.Contains(errOut, "cannot reach the admin API at http://127.0.0.1:1/v1/admin/rules") {
		t.Fatalf("nothing at -addr: exit %d\n%s%s", code, out, errOut)
	}

	// explain: one enforcer answers (its figures rounded), one has explain off.
	lvl := 13.333333
	x := enforcer.Explanation{Region: "us-east", RulesVersion: "v1", Rules: []enforcer.RuleExplain{{Rule: "default", Mode: "enforce", By: "api_key",
		Share:  enforcer.ShareExplain{Value: 1.0 / 3, Source: "default", Default: 1.0 / 3},
		Limits: []enforcer.LimitExplain{{Name: "second", GlobalRate: 500, GlobalBurst: 1000, Rate: 500.0 / 3, Burst: 1000.0 / 3, Level: &lvl}}}}}
	xb, _ := json.Marshal(x)
	mixed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(admin.ExplainResponse{Enforcers: []admin.EnforcerExplain{
			{Region: "us-east", ID: "us-east-1", Addr: "127.0.0.1:8080", Status: 200, Explain: xb},
			{Region: "eu-west", ID: "eu-west-1", Addr: "127.0.0.1:8180", Status: 404, Error: "404: explain is off on this enforcer: set explain.enabled: true"},
		}})
	}))
	defer mixed.Close()
	code, out, errOut = runCLI(env, "explain", "k1", "-addr", mixed.URL)
	t.Logf("balancer explain:\n%s%s", out, errOut)
	if code != 1 || !strings.Contains(errOut, "1 of 2 enforcers did not answer") || !strings.Contains(out, "eu-west/eu-west-1 (127.0.0.1:8180): 404: explain is off") {
		t.Fatalf("explain with one enforcer off: exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"166.67/s burst 333.33", "500/s burst 1000", "13.3", "0.333 default"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain output lacks %q", want)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if len(line) > 100 || strings.Contains(line, "166.666") {
			t.Errorf("explain line too wide or unrounded (%d columns): %q", len(line), line)
		}
	}
}

// TestRulesListMarksExpired (issue 28, item 9): `rules list` showed an expired override like
// any other; it no longer applies anywhere, and the list says so.
func TestRulesListMarksExpired(t *testing.T) {
	var out bytes.Buffer
	printRules(&out, admin.RulesResponse{Revision: 9, Rules: []admin.RuleEntry{
		{ID: "old", Key: "/allot/rules/old", ModRevision: 3, Rule: json.RawMessage(`{"id":"old","match":{"api_key":"k1"},"expires_at":"2026-01-01T00:00:00Z","limits":[{"name":"s","rate":5,"per":"1s"}]}`)},
		{ID: "live", Key: "/allot/rules/live", ModRevision: 4, Rule: json.RawMessage(`{"id":"live","match":{"api_key":"k2"},"expires_at":"2030-01-01T00:00:00Z","limits":[{"name":"s","rate":5,"per":"1s"}]}`)},
		{ID: "plain", Key: "/allot/rules/plain", ModRevision: 5, Rule: json.RawMessage(`{"id":"plain","limits":[{"name":"s","rate":5,"per":"1s"}]}`)},
		{ID: "broken", Key: "/allot/rules/broken", ModRevision: 6, Error: "rules: /allot/rules/broken:1: not a mapping"},
	}}, time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC))
	t.Logf("\n%s", out.String())
	want := map[string]string{"old": "EXPIRED", "live": "", "plain": "", "broken": "error"}
	for _, line := range strings.Split(out.String(), "\n")[2:] {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		state := f[3]
		if strings.HasPrefix(state, "{") || strings.HasPrefix(state, "rules:") {
			state = ""
		}
		if w, ok := want[f[0]]; !ok || state != w {
			t.Errorf("%s: state %q, want %q", f[0], state, w)
		}
		delete(want, f[0])
	}
	if len(want) > 0 {
		t.Errorf("not listed: %v", want)
	}
}
