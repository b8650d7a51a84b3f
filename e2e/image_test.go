package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/e2e/stack"
	"github.com/allot-dev/allot/pkg/testenv"
	tpoll "github.com/allot-dev/allot/pkg/testenv/poll"
)

// imageConfig is the part of `docker image inspect`'s .Config the image test reads.
type imageConfig struct {
	User        string
	Cmd         []string
	Labels      map[string]string
	Healthcheck struct{ Test []string }
}

// TestImage (issue 24 §2): the image `make image` builds (here under a tag of its own,
// removed at the end) runs as a non-root user, carries the OCI labels naming this
// checkout's version and commit, says its version from each binary, and an enforcer
// started from it as a user would (configured by ALLOT_* variables, the in-memory store
// and the shipped example rules) answers a check over HTTP and turns healthy under the
// image's own HEALTHCHECK (`enforcer probe`; the base has no curl).
func TestImage(t *testing.T) {
	testenv.Require(t)
	root := stack.RepoRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	desc, err := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "release.sh"), "describe").Output()
	f := strings.Fields(string(desc))
	if err != nil || len(f) != 3 {
		t.Fatalf("scripts/release.sh describe: %v, %q", err, desc)
	}
	version, commit := f[0], f[1]

	tag := fmt.Sprintf("allot/allot:test-%d-%04x", os.Getpid(), rand.IntN(1<<16))
	began := time.Now()
	build := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "images.sh"), "allot")
	build.Dir = root
	build.Env = append(os.Environ(), "ALLOT_IMAGE_TAG="+tag)
	var out, errb bytes.Buffer
	build.Stdout, build.Stderr = &out, &errb
	err = build.Run()
	t.Cleanup(func() { _, _ = docker("rmi", "-f", tag) }) // after the containers' removal (cleanups run last first)
	if err != nil || strings.TrimSpace(out.String()) != tag {
		t.Fatalf("scripts/images.sh allot: %v, stdout %q\n%s", err, out.String(), errb.String())
	}
	t.Logf("image %s built in %v", tag, time.Since(began).Round(time.Second))

	raw, err := docker("image", "inspect", "-f", "{{json .Config}}", tag)
	if err != nil {
		t.Fatal(err)
	}
	var cfg imageConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatalf("image config %q: %v", raw, err)
	}
	// Numeric, so Kubernetes' runAsNonRoot can check it without reading /etc/passwd.
	if uid, _, _ := strings.Cut(cfg.User, ":"); uid == "" || uid == "0" || strings.Trim(uid, "0123456789") != "" {
		t.Errorf("image user %q: want a numeric non-root uid", cfg.User)
	}
	for k, want := range map[string]string{
		"org.opencontainers.image.version":  version,
		"org.opencontainers.image.revision": commit,
		"org.opencontainers.image.source":   "github.com/allot-dev/allot",
	} {
		if got := cfg.Labels[k]; got != want {
			t.Errorf("label %s = %q, want %q", k, got, want)
		}
	}
	if want := []string{"CMD", "enforcer", "probe"}; !slices.Equal(cfg.Healthcheck.Test, want) {
		t.Errorf("healthcheck %q, want %q", cfg.Healthcheck.Test, want)
	}
	if !slices.Equal(cfg.Cmd, []string{"enforcer"}) {
		t.Errorf("cmd %q, want [enforcer]", cfg.Cmd)
	}

	// Who the processes run as, and what each binary says it is.
	who := testenv.Run(t, testenv.ProcOptions{Kind: "image", Image: tag,
		Argv: []string{"sh", "-c", "id -u; id -g; enforcer -version; balancer -version; regionsim -version"}})
	tpoll.True(t, time.Minute, "the version container exits", func() bool { return !who.Status(t).Running })
	if st := who.Status(t); st.ExitCode != 0 {
		t.Fatalf("version container: exit %d\n%s", st.ExitCode, who.Logs(20))
	}
	uid, _, _ := strings.Cut(cfg.User, ":")
	var wantLines []string
	wantLines = append(wantLines, uid, uid)
	for _, bin := range []string{"enforcer", "balancer", "regionsim"} {
		wantLines = append(wantLines, fmt.Sprintf("%s %s (commit %s, go", bin, version, commit))
	}
	lines := strings.Split(strings.TrimSpace(who.Logs(20)), "\n")
	if len(lines) != len(wantLines) {
		t.Fatalf("version container printed %q, want %d lines like %q", lines, len(wantLines), wantLines)
	}
	for i, want := range wantLines {
		if i < 2 && lines[i] != want || i >= 2 && !strings.HasPrefix(lines[i], want) {
			t.Errorf("line %d: %q, want %q…", i, lines[i], want)
		}
	}

	// An enforcer as the README runs it, on loopback ports (the harness uses host networking).
	ports := testenv.Ports(t, 2)
	httpAddr := "127.0.0.1:" + strconv.Itoa(ports[0])
	enf := testenv.Run(t, testenv.ProcOptions{Kind: "image-enforcer", Image: tag, Argv: []string{"enforcer"}, Env: []string{
		"ALLOT_REGION=us-east", "ALLOT_RULES_FILE=/etc/allot/rules/example.yaml",
		"ALLOT_HTTP_ADDR=" + httpAddr, "ALLOT_GRPC_ADDR=127.0.0.1:" + strconv.Itoa(ports[1]),
	}})
	client := &http.Client{Timeout: 5 * time.Second}
	enf.WaitReady(t, "enforcer in the image /readyz", time.Minute, func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/readyz", nil)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz %s", resp.Status)
		}
		return nil
	})
	resp, err := client.Post("http://"+httpAddr+"/v1/check", "application/json", strings.NewReader(`{"api_key":"k1","plan":"pro"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var check struct {
		Allowed bool   `json:"allowed"`
		Rule    string `json:"rule"`
		Source  string `json:"source"`
	}
	if err := json.Unmarshal(body, &check); err != nil || resp.StatusCode != http.StatusOK || !check.Allowed ||
		check.Rule != "pro" || check.Source != "memory" || resp.Header.Get("RateLimit-Policy") == "" {
		t.Fatalf("check: %s %s (headers %v); want 200, allowed by rule pro from memory, with RateLimit-Policy", resp.Status, body, resp.Header)
	}

	// Docker's own verdict, from the image's HEALTHCHECK (every 5 s).
	name := enf.Name()
	took := tpoll.Until(t, time.Minute, "the image's health check says healthy", func() error {
		s, err := docker("inspect", "-f", "{{.State.Health.Status}}", name)
		if err != nil {
			return err
		}
		if s = strings.TrimSpace(s); s != "healthy" {
			return fmt.Errorf("health %q", s)
		}
		return nil
	})
	t.Logf("healthy %v after the check was answered", took.Round(100*time.Millisecond))
}
