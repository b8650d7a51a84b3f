package version

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestResolve(t *testing.T) {
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev},
			{Key: "vcs.modified", Value: modified}}
	}
	const sha = "0123456789abcdef0123456789abcdef01234567"
	for _, tc := range []struct {
		name                    string
		stampedV, stampedC      string
		bi                      *debug.BuildInfo
		wantVersion, wantCommit string
	}{
		{name: "nothing at all", wantVersion: Dev, wantCommit: Unknown},
		{name: "go build without vcs", bi: &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}},
			wantVersion: Dev, wantCommit: Unknown},
		{name: "stamped by make release", stampedV: "v0.3.0", stampedC: sha,
			bi:          &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}},
			wantVersion: "v0.3.0", wantCommit: sha},
		{name: "stamped on an untagged commit", stampedV: "dev", stampedC: sha + "-dirty",
			wantVersion: Dev, wantCommit: sha + "-dirty"},
		{name: "stamps win over the build info", stampedV: "v0.3.0-2-g0123456", stampedC: sha,
			bi:          &debug.BuildInfo{Main: debug.Module{Version: "v0.2.0"}, Settings: vcs("fedcba", "true")},
			wantVersion: "v0.3.0-2-g0123456", wantCommit: sha},
		{name: "go install at a tag", bi: &debug.BuildInfo{Main: debug.Module{Version: "v0.3.0"}},
			wantVersion: "v0.3.0", wantCommit: Unknown},
		{name: "go install of a prerelease", bi: &debug.BuildInfo{Main: debug.Module{Version: "v0.4.0-rc.1"}},
			wantVersion: "v0.4.0-rc.1", wantCommit: Unknown},
		{name: "go build in a checkout: a pseudo-version is not a release",
			bi:          &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20260101120000-0123456789ab"}, Settings: vcs(sha, "false")},
			wantVersion: Dev, wantCommit: sha},
		{name: "pseudo-version after a tag",
			bi:          &debug.BuildInfo{Main: debug.Module{Version: "v0.3.1-0.20260101120000-0123456789ab"}, Settings: vcs(sha, "false")},
			wantVersion: Dev, wantCommit: sha},
		{name: "modified tree",
			bi:          &debug.BuildInfo{Main: debug.Module{Version: "v0.3.0+dirty"}, Settings: vcs(sha, "true")},
			wantVersion: Dev, wantCommit: sha + "-dirty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := resolve(tc.stampedV, tc.stampedC, tc.bi)
			if got.Version != tc.wantVersion || got.Commit != tc.wantCommit {
				t.Fatalf("got version %q commit %q, want %q %q", got.Version, got.Commit, tc.wantVersion, tc.wantCommit)
			}
			if got.Go != runtime.Version() || got.Platform != runtime.GOOS+"/"+runtime.GOARCH {
				t.Fatalf("go %q platform %q", got.Go, got.Platform)
			}
		})
	}
}

func TestLine(t *testing.T) {
	i := Info{Version: "v0.3.0", Commit: "abc", Go: "go1.26.8", Platform: "linux/arm64"}
	if got, want := i.Line("enforcer"), "enforcer v0.3.0 (commit abc, go1.26.8, linux/arm64)"; got != want {
		t.Fatalf("Line = %q, want %q", got, want)
	}
	// This test binary is not stamped: it must still say something sane.
	if g := Get(); g.Version == "" || g.Commit == "" || !strings.HasPrefix(g.Go, "go") {
		t.Fatalf("Get() = %+v", g)
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
