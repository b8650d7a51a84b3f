package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/e2e/stack"
)

// releaseRun is one run of scripts/release.sh from the repository root.
type releaseRun struct {
	args  []string
	env   []string // added to the test's environment
	umask string   // run under this umask ("" leaves the test's)
}

// run runs it, bounded by ctx: stdout, stderr and the exit status (-1 when it did not run
// to an exit).
func (r releaseRun) run(ctx context.Context, root string) (stdout, stderr string, code int) {
	script := `exec bash scripts/release.sh "$@"`
	if r.umask != "" {
		script = "umask " + r.umask + " && " + script
	}
	cmd := exec.CommandContext(ctx, "bash", append([]string{"-c", script, "release.sh"}, r.args...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), r.env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code = cmd.ProcessState.ExitCode()
	if err != nil && code == 0 {
		code = -1
	}
	return out.String(), errb.String(), code
}

// TestReleaseNotes (issue 24 §1): NOTES.md's changes are CHANGELOG.md's section for the
// version; a build no tag names exactly carries "Unreleased"; a release without its section,
// or a version no file name can hold, is refused before anything is built. Fast: it builds
// nothing.
func TestReleaseNotes(t *testing.T) {
	root := stack.RepoRoot(t)
	changelog := filepath.Join(t.TempDir(), "CHANGELOG.md")
	if err := os.WriteFile(changelog, []byte("# Changelog\n\n## Unreleased\n\n- next\n\n## v1.2.0 — 2027-01-02\n\n- a thing\n- b thing\n\n## v1.1.0\n- old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct {
		version  string
		code     int
		out, err string
	}{
		{version: "v1.2.0", out: "- a thing\n- b thing\n"},
		{version: "v1.1.0", out: "- old\n"},
		{version: "v1.2.0-3-gabc1234", out: "Not a release: the changes since the last one (CHANGELOG.md, \"Unreleased\").\n\n- next\n"},
		{version: "v1.2.0-dirty", out: "- next\n"},
		{version: "dev", out: "- next\n"},
		{version: "v1.3.0", code: 1, err: `has no "## v1.3.0" section`},
		{version: "v1/3", code: 2, err: `version "v1/3": want letters, digits and . _ + -`},
	} {
		out, errs, code := releaseRun{args: []string{"notes"}, env: []string{
			"ALLOT_CHANGELOG=" + changelog, "ALLOT_VERSION=" + tc.version, "ALLOT_COMMIT=c0ffee", "SOURCE_DATE_EPOCH=0",
		}}.run(ctx, root)
		if code != tc.code || !strings.HasSuffix(out, tc.out) || !strings.Contains(errs, tc.err) {
			t.Errorf("notes for %s: exit %d, stdout %q, stderr %q; want exit %d, stdout ending %q, stderr with %q",
				tc.version, code, out, errs, tc.code, tc.out, tc.err)
		}
	}
	// The repository's own CHANGELOG.md serves this checkout's version: a tag pushed
	// without its section fails here, not at release time.
	if out, errs, code := (releaseRun{args: []string{"notes"}}).run(ctx, root); code != 0 || out == "" {
		t.Errorf("CHANGELOG.md for this checkout: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

// TestReleaseReproducible (issue 24 §1): `make release` for linux/amd64, run twice at once
// into different directories, with different temporary directories and umasks, gives the
// same bytes; the archive holds what a user needs, with fixed owners, modes and times,
// its binaries say their version, and SHA256SUMS is right. The two runs share the Go
// build cache (compiling is Go's to keep reproducible; the runs test the link, the stamps
// and the packaging); ALLOT_RELEASE_COLD_CACHE=1 (`make release-check`) gives the second
// an empty one, which compiles everything (minutes).
func TestReleaseReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("release: builds the release binaries (about 10 s of CPU a run, more on a cold cache)")
	}
	root := stack.RepoRoot(t)
	cold, _ := strconv.ParseBool(os.Getenv("ALLOT_RELEASE_COLD_CACHE"))
	timeout := 10 * time.Minute
	if cold {
		timeout = 30 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	desc, errs, code := releaseRun{args: []string{"describe"}}.run(ctx, root)
	f := strings.Fields(desc)
	if code != 0 || len(f) != 3 {
		t.Fatalf("describe: exit %d, %q, %s", code, desc, errs)
	}
	version, commit := f[0], f[1]
	epoch, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil {
		t.Fatalf("describe: source date %q: %v", f[2], err)
	}

	dirs := [2]string{t.TempDir(), t.TempDir()}
	runs := [2]releaseRun{
		{env: []string{"ALLOT_RELEASE_ARCHES=amd64", "ALLOT_RELEASE_DIR=" + dirs[0], "TMPDIR=" + t.TempDir()}},
		{env: []string{"ALLOT_RELEASE_ARCHES=amd64", "ALLOT_RELEASE_DIR=" + dirs[1], "TMPDIR=" + t.TempDir()}, umask: "077"},
	}
	if cold {
		runs[1].env = append(runs[1].env, "GOCACHE="+t.TempDir())
	}
	began := time.Now()
	var wg sync.WaitGroup
	var results [2]struct {
		out, errs string
		code      int
	}
	for i := range runs {
		wg.Go(func() {
			r := &results[i]
			r.out, r.errs, r.code = runs[i].run(ctx, root)
		})
	}
	wg.Wait()
	for i, r := range results {
		if r.code != 0 || strings.TrimSpace(r.out) != dirs[i] {
			t.Fatalf("release run %d: exit %d, stdout %q\n%s", i, r.code, r.out, r.errs)
		}
	}
	t.Logf("two release runs for linux/amd64 (cold cache: %v) in %v", cold, time.Since(began).Round(time.Second))

	name := "allot-" + version + "-linux-amd64"
	want := []string{"NOTES.md", "SHA256SUMS", name + ".tar.gz"}
	files := [2]map[string][]byte{}
	for i, dir := range dirs {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		files[i] = map[string][]byte{}
		var got []string
		for _, e := range ents {
			got = append(got, e.Name())
			if files[i][e.Name()], err = os.ReadFile(filepath.Join(dir, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("run %d wrote %q, want %q", i, got, want)
		}
	}
	for _, n := range want {
		if !bytes.Equal(files[0][n], files[1][n]) {
			t.Errorf("%s differs between the two runs (%d and %d bytes): the release is not reproducible", n, len(files[0][n]), len(files[1][n]))
		}
	}

	// SHA256SUMS, as `sha256sum -c` reads it.
	var sums []string
	for _, n := range []string{name + ".tar.gz", "NOTES.md"} {
		h := sha256.Sum256(files[0][n])
		sums = append(sums, hex.EncodeToString(h[:])+"  "+n)
	}
	if got, want := string(files[0]["SHA256SUMS"]), strings.Join(sums, "\n")+"\n"; got != want {
		t.Errorf("SHA256SUMS:\n%s\nwant:\n%s", got, want)
	}
	if notes := string(files[0]["NOTES.md"]); !strings.HasPrefix(notes, "# allot "+version+"\n") ||
		!strings.Contains(notes, "- commit: "+commit+"\n") || !strings.Contains(notes, "## Changes\n") {
		t.Errorf("NOTES.md:\n%s", notes)
	}

	checkArchive(t, filepath.Join(dirs[0], name+".tar.gz"), name, time.Unix(epoch, 0), version, commit)
}

// checkArchive reads the release archive at path: gzip without a name or time; every
// entry under name/, owned by 0:0, at the source date, directories and binaries 0755, the
// rest 0644; the three binaries, README.md, CHANGELOG.md and the shipped configs, no Go
// file; and, on linux/amd64, its enforcer's -version names version and commit. gzip
// decompresses (Go's inflate under -race would take most of the test's time).
func checkArchive(t *testing.T, path, name string, date time.Time, version, commit string) {
	t.Helper()
	head := make([]byte, 10)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.ReadFull(f, head)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	// RFC 1952: ID1 ID2 CM FLG MTIME(4) XFL OS; FLG bit 3 is FNAME.
	if head[0] != 0x1f || head[1] != 0x8b || head[3]&0x08 != 0 || !bytes.Equal(head[4:8], []byte{0, 0, 0, 0}) {
		t.Errorf("gzip header % x carries a name or a time (want neither: gzip -n)", head)
	}
	gz := exec.Command("gzip", "-dc", path)
	pipe, err := gz.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := gz.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		io.Copy(io.Discard, pipe)
		if err := gz.Wait(); err != nil {
			t.Errorf("gzip -dc %s: %v", path, err)
		}
	}()
	tr := tar.NewReader(pipe)
	seen := map[string]bool{}
	var enforcer []byte
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		rel, ok := strings.CutPrefix(h.Name, name+"/")
		if !ok && h.Name != name+"/" {
			t.Errorf("%s is outside %s/", h.Name, name)
		}
		seen[rel] = true
		binary := rel == "enforcer" || rel == "balancer" || rel == "regionsim"
		wantMode := int64(0o644)
		if h.Typeflag == tar.TypeDir || binary {
			wantMode = 0o755
		}
		if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(date) || h.Mode&0o7777 != wantMode {
			t.Errorf("%s: uid %d gid %d mtime %v mode %o; want 0 0 %v %o", h.Name, h.Uid, h.Gid, h.ModTime, h.Mode, date, wantMode)
		}
		if strings.HasSuffix(rel, ".go") || strings.Contains(rel, "testdata") {
			t.Errorf("%s is not for users", h.Name)
		}
		if rel == "enforcer" {
			if enforcer, err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, want := range []string{"enforcer", "balancer", "regionsim", "README.md", "CHANGELOG.md",
		"configs/regions/us-east.yaml", "configs/balancer.yaml", "configs/rules/example.yaml",
		"configs/grafana/allot.json", "configs/prometheus/allot-rules.yaml", "configs/scenarios/demo.yaml"} {
		if !seen[want] {
			t.Errorf("the archive lacks %s/%s", name, want)
		}
	}
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" || enforcer == nil {
		return
	}
	bin := filepath.Join(t.TempDir(), "enforcer")
	if err := os.WriteFile(bin, enforcer, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "-version").CombinedOutput()
	wantLine := fmt.Sprintf("enforcer %s (commit %s, go", version, commit)
	if err != nil || !strings.HasPrefix(string(out), wantLine) || !strings.HasSuffix(string(out), ", linux/amd64)\n") {
		t.Errorf("the archive's enforcer -version: %v, %q; want %q…, linux/amd64)", err, out, wantLine)
	}
}
