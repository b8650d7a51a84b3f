package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain lets a test run this binary's main as a child process.
func TestMain(m *testing.M) {
	if os.Getenv("ENFORCER_TEST_MAIN") == "1" {
		os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// TestProcessReloadsOnSIGHUPAndStopsOnSIGTERM runs the enforcer as a real process with the
// memory store: SIGHUP reloads the rules file, SIGTERM shuts it down with exit 0.
func TestProcessReloadsOnSIGHUPAndStopsOnSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	os.WriteFile(rulesPath, []byte("rules:\n  - id: before\n    limits: [{name: s, rate: 5, per: 1s}]\n"), 0o644)
	cmd := exec.Command(os.Args[0], "-region", "us-east", "-rules-file", rulesPath,
		"-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0", "-log-level", "info")
	cmd.Env = append(os.Environ(), "ENFORCER_TEST_MAIN=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
		close(lines)
	}()
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
	})
	// The "serving" log line names the HTTP address.
	var addr string
	re := regexp.MustCompile(`http=(127\.0\.0\.1:\d+)`)
	deadline := time.After(20 * time.Second)
	for addr == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("process exited before serving")
			}
			if m := re.FindStringSubmatch(l); m != nil && strings.Contains(l, "serving") {
				addr = m[1]
			}
		case <-deadline:
			t.Fatal("no serving line within 20s")
		}
	}
	rule := func() string {
		resp, err := http.Post("http://"+addr+"/v1/check", "application/json", strings.NewReader(`{"api_key":"k"}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct{ Rule string }
		b, _ := io.ReadAll(resp.Body)
		json.Unmarshal(b, &out)
		return out.Rule
	}
	if r := rule(); r != "before" {
		t.Fatalf("rule %q, want before", r)
	}
	os.WriteFile(rulesPath, []byte("rules:\n  - id: after\n    limits: [{name: s, rate: 5, per: 1s}]\n"), 0o644)
	cmd.Process.Signal(syscall.SIGHUP)
	end := time.Now().Add(10 * time.Second)
	for rule() != "after" {
		if time.Now().After(end) {
			t.Fatal("SIGHUP did not reload the rules within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no exit within 15s of SIGTERM")
	}
}
