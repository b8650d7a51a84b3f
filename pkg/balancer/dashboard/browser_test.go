package dashboard

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// chromium returns the path of a headless chromium, installed by scripts/tools.sh when
// missing (not under -short: unit-test runs install nothing). Without it the test skips,
// except under CI=true where it fails. ALLOT_CHROMIUM names another binary.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("ALLOT_CHROMIUM"); p != "" {
		return p
	}
	if testing.Short() && os.Getenv("CI") != "true" {
		if p, err := exec.LookPath("chromium"); err == nil {
			return p
		}
		t.Skip("chromium is not installed; without -short the test installs it (scripts/tools.sh chromium)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var stderr strings.Builder
	cmd := exec.CommandContext(ctx, "bash", "../../../scripts/tools.sh", "chromium")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := fmt.Sprintf("chromium not available (scripts/tools.sh chromium: %v):\n%s", err, stderr.String())
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return strings.TrimSpace(string(out))
}

// headless runs chromium on url with args (--dump-dom, --screenshot=…) and returns its
// standard output.
func headless(t *testing.T, bin, url string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
		"--disable-extensions", "--hide-scrollbars", "--user-data-dir=" + t.TempDir()}
	cmd := exec.CommandContext(ctx, bin, append(append(base, args...), url)...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", bin, args, err, stderr.String())
	}
	return string(out)
}

// artifacts is where screenshots go: $ALLOT_ARTIFACTS when set (kept), else a temp dir.
func artifacts(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("ALLOT_ARTIFACTS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

var (
	pointsRE = regexp.MustCompile(`<svg id="drift"[^>]*data-points="(\d+)"`)
	lineRE   = regexp.MustCompile(`<polyline class="ln r\d" points="([0-9., ]+)"`)
	shareRE  = regexp.MustCompile(`<text class="seg"[^>]*>(\d+)%</text>`)
)

// The dashboard in a real browser, against a balancer fed by a 40-minute virtual run:
// the DOM chromium builds has the drift chart's points, every region's name and non-zero
// shares, the hostile identities as inert text; and a screenshot is written.
func TestDashboardInChromium(t *testing.T) {
	bin := chromium(t)
	d, src, _ := run(t, 40*time.Minute, nil)
	srv := httptest.NewServer(d)
	defer srv.Close()

	dom := headless(t, bin, srv.URL+"/dashboard/", "--dump-dom")
	m := pointsRE.FindStringSubmatch(dom)
	if m == nil {
		t.Fatalf("no drift chart in the DOM:\n%.2000s", dom)
	}
	if n, _ := strconv.Atoi(m[1]); n < 100 {
		t.Errorf("drift chart has %d data points, want ≥ 100 (3 regions × ~40 samples)", n)
	}
	if lines := lineRE.FindAllStringSubmatch(dom, -1); len(lines) == 0 || len(strings.Fields(lines[0][1])) < 2 {
		t.Errorf("no polyline with points in the DOM")
	}
	for _, r := range regions {
		if !strings.Contains(dom, r) {
			t.Errorf("region %s not in the DOM", r)
		}
	}
	nonZero := 0
	for _, s := range shareRE.FindAllStringSubmatch(dom, -1) {
		if v, _ := strconv.Atoi(s[1]); v > 0 {
			nonZero++
		}
	}
	if nonZero == 0 {
		t.Error("no non-zero share label in the DOM")
	}
	if !strings.Contains(dom, "key:k_acme") {
		t.Error("the hot key is not in the DOM")
	}
	// The hostile identities: shown as text, nothing of theirs parsed or run.
	if strings.Contains(dom, "pwned") && !strings.Contains(dom, "&lt;script&gt;document.title='pwned'&lt;/script&gt;") {
		t.Error("the <script> identity is not shown escaped")
	}
	if strings.Contains(dom, "<title>allot balancer · overview</title>") == false {
		t.Errorf("the title changed: a hostile identity ran?\n%.300s", dom)
	}
	if strings.Count(dom, "<script") != 1 || strings.Contains(dom, `<img src="x"`) {
		t.Error("a hostile identity became an element")
	}

	// One identity's page.
	idDOM := headless(t, bin, srv.URL+"/dashboard/identity?identity=key:k_acme", "--dump-dom")
	for _, want := range []string{`id="share"`, `id="tokens"`, `id="refused"`, "pro", "500/s", "us-east"} {
		if !strings.Contains(idDOM, want) {
			t.Errorf("identity page: %q not in the DOM", want)
		}
	}

	dir := artifacts(t)
	// The page as served, too: it needs nothing else, so it renders from the file, offline
	// (docs/dashboard.png is its small screenshot, the top of the page at 0.85 scale).
	_, page := get(t, d, "/dashboard/")
	html := filepath.Join(dir, "dashboard.html")
	if err := os.WriteFile(html, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, shot := range []struct{ name, url, size, scale string }{
		{"dashboard.png", srv.URL + "/dashboard/", "1280,1600", "1"},
		{"identity.png", srv.URL + "/dashboard/identity?identity=key:k_globex", "1280,1100", "1"},
		{"dashboard-small.png", "file://" + html, "1240,678", "0.85"},
	} {
		png := filepath.Join(dir, shot.name)
		headless(t, bin, shot.url, "--screenshot="+png, "--window-size="+shot.size, "--force-device-scale-factor="+shot.scale)
		b, err := os.ReadFile(png)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 10_000 || string(b[1:4]) != "PNG" {
			t.Fatalf("%s: %d bytes, not a PNG", png, len(b))
		}
		t.Logf("screenshot: %s (%d bytes)", png, len(b))
	}

	// A standby: the banner, the leader, no data.
	src.setCore(nil)
	dom = headless(t, bin, srv.URL+"/dashboard/", "--dump-dom", "--screenshot="+filepath.Join(dir, "standby.png"), "--window-size=1280,400")
	if !strings.Contains(dom, `<b id="leader">10.0.0.7:9090</b>`) || strings.Contains(dom, `id="regions"`) {
		t.Errorf("standby page:\n%.1500s", dom)
	}
}
