package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/allot-dev/allot/pkg/balancer/admin"
	"github.com/allot-dev/allot/pkg/enforcer"
)

// seen is one request the fake admin API received.
type seen struct {
	method, path, query, ifMatch, auth string
	body                               map[string]any
}

// fakeAdmin answers every admin route with a canned answer and records what it was sent.
func fakeAdmin(t *testing.T) (*httptest.Server, func() []seen) {
	t.Helper()
	var mu sync.Mutex
	var got []seen
	x, _ := json.Marshal(enforcer.Explanation{Region: "us-east", RulesVersion: "v1"})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := seen{method: r.Method, path: r.URL.Path, query: r.URL.RawQuery, ifMatch: r.Header.Get("If-Match"), auth: r.Header.Get("Authorization")}
		if b, _ := io.ReadAll(r.Body); len(b) > 0 {
			_ = json.Unmarshal(b, &s.body)
		}
		mu.Lock()
		got = append(got, s)
		mu.Unlock()
		var v any
		switch p := r.URL.Path; {
		case r.Method == http.MethodGet && (p == "/v1/admin/rules" || p == "/v1/admin/overrides"):
			v = admin.RulesResponse{Revision: 7}
		case r.Method == http.MethodPut || r.Method == http.MethodDelete:
			v = admin.Result{Revision: 8, Changed: []string{"x"}}
		case strings.HasPrefix(p, "/v1/admin/shares/"):
			v = admin.SharesResponse{Identity: "key:k1", Source: "core", Regions: []string{"us-east"}}
		case p == "/v1/admin/explain":
			v = admin.ExplainResponse{Enforcers: []admin.EnforcerExplain{{Region: "us-east", ID: "e1", Status: 200, Explain: x}}}
		case p == "/v1/admin/audit":
			v = map[string]any{"records": []admin.AuditRecord{}}
		default:
			w.WriteHeader(http.StatusNotFound)
			v = admin.ErrorResponse{Error: "no route"}
		}
		_ = json.NewEncoder(w).Encode(v)
	}))
	t.Cleanup(srv.Close)
	return srv, func() []seen {
		mu.Lock()
		defer mu.Unlock()
		out := got
		got = nil
		return out
	}
}

// TestCLIFlagsOfEachCommand (issue 25): each admin command has its own flag set. A flag
// that belongs to another command (or to none) is refused before anything is sent, naming
// the flag, the command and the commands that take it; every command's documented flags
// parse and reach the request they are for.
func TestCLIFlagsOfEachCommand(t *testing.T) {
	srv, requests := fakeAdmin(t)
	env := map[string]string{"ALLOT_ADMIN_ADDR": srv.URL, "ALLOT_ADMIN_TOKEN": "s3cret-0123456789abc", "MY_TOKEN": "mine-0123456789abcdef"}
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	write(t, file, "rules:\n  - id: default\n    limits: [{name: second, rate: 20, per: 1s}]\n")
	example := filepath.Join("..", "..", "configs", "rules", "example.yaml")

	t.Run("misplaced", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			want []string // in stderr
		}{
			{[]string{"audit", "-rate", "5"}, []string{"balancer audit: -rate is not a flag of audit (a flag of override set)", "usage: balancer audit [-n 20]", "audit takes -n, and the connection flags -addr"}},
			{[]string{"rules", "delete", "old", "-reason", "x", "-dry-run"}, []string{"balancer rules delete: -dry-run is not a flag of rules delete (a flag of rules apply, override set)"}},
			{[]string{"rules", "list", "-f", file}, []string{"-f is not a flag of rules list (a flag of rules apply, rules check)", "rules list takes no flags of its own"}},
			{[]string{"rules", "check", "-f", example, "-addr", srv.URL}, []string{"balancer rules check: -addr is not a flag of rules check (it reaches the admin API", "rules check takes -f\n"}},
			{[]string{"shares", "k1", "-n", "3"}, []string{"balancer shares: -n is not a flag of shares (a flag of audit)"}},
			{[]string{"explain", "k1", "-reason", "x"}, []string{"balancer explain: -reason is not a flag of explain (a flag of rules apply, rules delete, override set, override delete)"}},
			{[]string{"override", "delete", "k1", "-reason", "x", "-rate", "5"}, []string{"balancer override delete: -rate is not a flag of override delete (a flag of override set)"}},
			{[]string{"override", "set", "k1", "-plan", "pro"}, []string{"-plan is not a flag of override set (a flag of explain)"}},
			{[]string{"audit", "-frobnicate"}, []string{"balancer audit: -frobnicate is not a flag of audit\n"}},
			{[]string{"audit", "5"}, []string{"balancer audit: takes no arguments, got [\"5\"]", "usage: balancer audit [-n 20]"}},
			{[]string{"rules", "list", "extra"}, []string{"balancer rules list: takes no arguments"}},
		} {
			code, out, errOut := runCLI(env, tc.args...)
			if code != 2 || out != "" {
				t.Errorf("%v: exit %d, want 2\n%s%s", tc.args, code, out, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("%v: stderr lacks %q:\n%s", tc.args, w, errOut)
				}
			}
			if r := requests(); len(r) > 0 {
				t.Errorf("%v: sent %d requests, want none", tc.args, len(r))
			}
		}
	})

	t.Run("documented", func(t *testing.T) {
		tested := map[string]bool{}
		for _, tc := range []struct {
			name  string // the command
			args  []string
			check func(t *testing.T, r []seen)
		}{
			{"rules list", []string{"rules", "list", "-addr", srv.URL, "-token-env", "MY_TOKEN", "-timeout", "5s"}, func(t *testing.T, r []seen) {
				want(t, len(r) == 1 && r[0].method == "GET" && r[0].path == "/v1/admin/rules" && r[0].auth == "Bearer mine-0123456789abcdef", r)
			}},
			{"rules apply", []string{"rules", "apply", "-f", file, "-reason", "OPS-1", "-revision", "7", "-dry-run"}, func(t *testing.T, r []seen) {
				want(t, len(r) == 1 && r[0].method == "PUT" && r[0].path == "/v1/admin/rules" && r[0].body["revision"] == 7.0 &&
					r[0].body["reason"] == "OPS-1" && r[0].body["dry_run"] == true && r[0].body["file"] == file, r)
			}},
			{"rules check", []string{"rules", "check", "-f", example}, func(t *testing.T, r []seen) { want(t, len(r) == 0, r) }},
			{"rules delete", []string{"rules", "delete", "old", "-reason", "OPS-2", "-revision", "7"}, func(t *testing.T, r []seen) {
				want(t, len(r) == 1 && r[0].method == "DELETE" && r[0].path == "/v1/admin/rules/old" && r[0].query == "reason=OPS-2" && r[0].ifMatch == "7", r)
			}},
			{"override list", []string{"override", "list"}, func(t *testing.T, r []seen) {
				want(t, len(r) == 1 && r[0].method == "GET" && r[0].path == "/v1/admin/overrides", r)
			}},
			{"override set", []string{"override", "set", "k1", "-rate", "500", "-per", "1s", "-burst", "1000", "-limit", "minute=20000/1m",
				"-expires", "72h", "-reason", "launch", "-revision", "7", "-dry-run"}, func(t *testing.T, r []seen) {
				ok := len(r) == 1 && r[0].method == "PUT" && r[0].path == "/v1/admin/overrides/k1" && r[0].body["revision"] == 7.0 &&
					r[0].body["reason"] == "launch" && r[0].body["dry_run"] == true && r[0].body["expires_at"] != ""
				if ok {
					l, _ := json.Marshal(r[0].body["limits"])
					ok = string(l) == `[{"burst":1000,"name":"second","per":"1s","rate":500},{"name":"minute","per":"1m","rate":20000}]`
				}
				want(t, ok, r)
			}},
			{"override delete", []string{"override", "delete", "k1", "-reason", "OPS-3", "-revision", "7"}, func(t *testing.T, r []seen) {
				want(t, len(r) == 1 && r[0].method == "DELETE" && r[0].path == "/v1/admin/overrides/k1" && r[0].ifMatch == "7", r)
			}},
			{"shares", []string{"shares", "k1"}, func(t *testing.T, r []seen) {
				want(t, len(r) == 1 && r[0].path == "/v1/admin/shares/k1", r)
			}},
			{"explain", []string{"explain", "k1", "-plan", "pro", "-org", "acme", "-endpoint", "GET /v1/x", "-ip", "10.0.0.1"}, func(t *testing.T, r []seen) {
				want(t, len(r) == 1 && r[0].path == "/v1/admin/explain" &&
					r[0].query == "api_key=k1&endpoint=GET+%2Fv1%2Fx&ip=10.0.0.1&org=acme&plan=pro", r)
			}},
			{"audit", []string{"audit", "-n", "5"}, func(t *testing.T, r []seen) {
				want(t, len(r) == 1 && r[0].path == "/v1/admin/audit" && r[0].query == "limit=5", r)
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				tested[tc.name] = true
				code, out, errOut := runCLI(env, tc.args...)
				if code != 0 {
					t.Fatalf("%v: exit %d\n%s%s", tc.args, code, out, errOut)
				}
				tc.check(t, requests())
			})
		}
		for _, c := range commands {
			if !tested[c.name] {
				t.Errorf("%s: no case runs it with its documented flags", c.name)
			}
		}
	})

	// Every flag a usage line names is one its command takes.
	t.Run("usage lines", func(t *testing.T) {
		for i := range commands {
			c := &commands[i]
			fs, _, _ := c.flagSet(noEnv)
			for _, f := range regexp.MustCompile(`-[a-z][a-z-]*`).FindAllString(c.usage, -1) {
				if fs.Lookup(f[1:]) == nil {
					t.Errorf("%q names %s, which %s does not take", c.usage, f, c.name)
				}
			}
		}
	})

	// The examples in the README parse as they are written.
	t.Run("README", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, line := range strings.Split(string(b), "\n") {
			args := shellWords(strings.TrimSpace(strings.SplitN(line, "  #", 2)[0]))
			if len(args) < 2 || args[0] != "balancer" || !isCLI(args[1:]) {
				continue
			}
			args = args[1:]
			name, rest := args[0], args[1:]
			if (name == "rules" || name == "override") && len(rest) > 0 {
				name, rest = name+" "+rest[0], rest[1:]
			}
			c := lookup(name)
			if c == nil {
				t.Errorf("README: %q: no such command", line)
				continue
			}
			fs, _, _ := c.flagSet(noEnv)
			if _, err := parseInterleaved(fs, rest); err != nil {
				t.Errorf("README: %q: %v", line, err)
			}
			n++
		}
		if n < 5 {
			t.Errorf("found %d CLI examples in the README, want the admin section's", n)
		}
	})
}

func want(t *testing.T, ok bool, r []seen) {
	t.Helper()
	if !ok {
		t.Fatalf("requests sent: %+v", r)
	}
}

// shellWords splits a command line at spaces outside double quotes.
func shellWords(s string) []string {
	var out []string
	var cur strings.Builder
	quoted, any := false, false
	for _, r := range s {
		switch {
		case r == '"':
			quoted, any = !quoted, true
		case r == ' ' && !quoted:
			if any {
				out = append(out, cur.String())
				cur.Reset()
				any = false
			}
		default:
			cur.WriteRune(r)
			any = true
		}
	}
	if any {
		out = append(out, cur.String())
	}
	return out
}
