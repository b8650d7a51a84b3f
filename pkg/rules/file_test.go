package rules

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/clock"
)

func ruleFile(version string, rate int) string {
	return "version: " + version + "\nrules:\n  - id: a\n    limits: [{name: s, rate: " + strconv.Itoa(rate) + ", per: 1s}]\n"
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil { // atomic, as config tools do
		t.Fatal(err)
	}
}

// errRecorder collects what a source reports through the OnError hook.
type errRecorder struct {
	mu   sync.Mutex
	errs []error
}

func (r *errRecorder) hook(err error) { r.mu.Lock(); r.errs = append(r.errs, err); r.mu.Unlock() }
func (r *errRecorder) count() int     { r.mu.Lock(); defer r.mu.Unlock(); return len(r.errs) }

func TestFileSourceReloadKeepsOldOnBadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, ruleFile("v1", 10))
	clk := clock.NewFake(t0)
	h := NewHolder(nil)
	var rec errRecorder
	fs, err := NewFileSource(path, h, CompileOptions{}, WithClock(clk), WithOnError(rec.hook))
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	if v := h.Current().Version(); v != "v1" {
		t.Fatalf("initial version %q", v)
	}
	if st := fs.Status(); st.Version != "v1" || !st.LoadedAt.Equal(t0) || st.Loads != 1 || st.LastError != nil {
		t.Fatalf("status %+v", st)
	}

	// A bad file is refused: the error names the file, rule, field and line; v1 stays.
	writeFile(t, path, "version: v2\nrules:\n  - id: a\n    limits: [{name: s, rate: -5, per: 1s}]\n")
	err = fs.Reload()
	if err == nil || !strings.Contains(err.Error(), path+`:4: rule "a": limits[0].rate: -5`) {
		t.Fatalf("Reload bad file: %v", err)
	}
	if v := h.Current().Version(); v != "v1" {
		t.Fatalf("bad file replaced the snapshot: %q", v)
	}
	if st := fs.Status(); st.Version != "v1" || st.LastError == nil || st.Failures != 1 || rec.count() != 1 {
		t.Fatalf("status after bad file %+v, hook calls %d", st, rec.count())
	}

	// A missing file is refused too.
	os.Remove(path)
	if err := fs.Reload(); err == nil || h.Current().Version() != "v1" {
		t.Fatalf("missing file: %v, version %s", err, h.Current().Version())
	}

	// A good file goes in and clears the error.
	writeFile(t, path, ruleFile("v3", 30))
	clk.Advance(time.Minute)
	if err := fs.Reload(); err != nil {
		t.Fatal(err)
	}
	if st := fs.Status(); h.Current().Version() != "v3" || st.LastError != nil || !st.LoadedAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("after good reload: %s %+v", h.Current().Version(), st)
	}
	if !h.Current().Created().Equal(t0.Add(time.Minute)) {
		t.Fatalf("Created %v, want the fake clock's time", h.Current().Created())
	}
	// Reloading the same content keeps the snapshot in force (same pointer).
	cur := h.Current()
	if err := fs.Reload(); err != nil || h.Current() != cur {
		t.Fatalf("same content reload: %v, swapped=%v", err, h.Current() != cur)
	}
	fs.Close()
	fs.Close() // idempotent
	if err := fs.Reload(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Reload after Close: %v", err)
	}
}

func TestNewFileSourceRefusesBadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, "rules:\n  - id: a\n    limitz: []\n")
	h := NewHolder(nil)
	if _, err := NewFileSource(path, h, CompileOptions{}); err == nil || !strings.Contains(err.Error(), `rule "a": limitz: unknown field`) {
		t.Fatalf("got %v", err)
	}
	if h.Current().Version() != "" {
		t.Fatal("bad file reached the holder")
	}
}

// Run notices a changed file on the fake clock's interval, skips a bad one (reporting it
// once), and stops on Close.
func TestFileSourceRunPolls(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, ruleFile("v1", 10))
	clk := clock.NewFake(t0)
	h := NewHolder(nil)
	var rec errRecorder
	fs, err := NewFileSource(path, h, CompileOptions{}, WithClock(clk), WithInterval(5*time.Second), WithOnError(rec.hook))
	if err != nil {
		t.Fatal(err)
	}
	sub, cancel := h.Subscribe()
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- fs.Run(context.Background()) }()

	tick := func() {
		t.Helper()
		waitTimers(t, clk, 1) // Run is parked on its timer
		clk.Advance(5 * time.Second)
		waitTimers(t, clk, 1) // and has finished the check and parked again
	}

	writeFile(t, path, ruleFile("v2", 20))
	tick()
	if s := recv(t, sub); s.Version() != "v2" {
		t.Fatalf("got %s", s.Version())
	}

	writeFile(t, path, "rules: [\n")
	tick()
	tick() // the same bad content is not reported twice
	if h.Current().Version() != "v2" || rec.count() != 1 || fs.Status().LastError == nil {
		t.Fatalf("bad file: version %s, %d errors", h.Current().Version(), rec.count())
	}

	writeFile(t, path, ruleFile("v3", 30))
	tick()
	if s := recv(t, sub); s.Version() != "v3" {
		t.Fatalf("got %s", s.Version())
	}

	if err := fs.Run(context.Background()); err == nil {
		t.Fatal("second Run accepted")
	}
	fs.Close()
	if err := <-runErr; !errors.Is(err, ErrClosed) {
		t.Fatalf("Run returned %v", err)
	}
}

func TestFileSourceRunStopsOnContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, ruleFile("v1", 10))
	fs, err := NewFileSource(path, NewHolder(nil), CompileOptions{}, WithClock(clock.NewFake(t0)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := fs.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	fs.Close()
}

// waitTimers waits (bounded, in real time) until the fake clock has n timers: the
// goroutine under test has parked. It yields, it does not sleep a fixed time.
func waitTimers(t *testing.T, clk *clock.Fake, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for clk.Timers() != n {
		if time.Now().After(deadline) {
			t.Fatalf("fake clock has %d timers, want %d", clk.Timers(), n)
		}
		runtime.Gosched()
	}
}

func recv(t *testing.T, c <-chan *Snapshot) *Snapshot {
	t.Helper()
	select {
	case s := <-c:
		return s
	case <-time.After(5 * time.Second):
		t.Fatal("no snapshot within 5s")
		return nil
	}
}
