package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestLiveCommandSurvivesBash (issue 28, item 6): the regionsim command stack-up prints is
// pasted into a shell; its -targets holds '|' between a region's addresses, which bash
// took for a pipe. bash must hand regionsim the targets whole.
func TestLiveCommandSurvivesBash(t *testing.T) {
	targets := "us-east=127.0.0.1:20001|127.0.0.1:20002,eu-west=127.0.0.1:20003|127.0.0.1:20004,ap-south=127.0.0.1:20005"
	cmd := liveCommand(targets)
	// The same words, printed one a line by printf instead of run by go.
	script := strings.Replace(cmd, "go run ./cmd/regionsim", "printf '%s\\n'", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "bash", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("bash -c %q: %v\n%s", script, err, out)
	}
	want := []string{"run", "-mode", "live", "-scenario", "configs/scenarios/stack-shift.yaml", "-targets", targets}
	if got := strings.Fields(string(out)); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("bash passed %q, want %q (printed command:\n%s)", got, want, cmd)
	}
	if q := shellQuote("it's"); q != `'it'\''s'` {
		t.Fatalf("shellQuote(it's) = %s", q)
	}
}
