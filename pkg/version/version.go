// Package version says which build of allot a binary is: the release version, the commit it
// was built from and the Go toolchain that built it, for `enforcer -version`, `balancer
// -version` and `regionsim -version` and the first log line of a server.
//
// Where the values come from, first found wins:
//
//  1. The linker: `make release`, `make image` and `make build` stamp both through
//     scripts/release.sh (`-ldflags "-X <pkg>.version=v0.3.0 -X <pkg>.commit=<sha>"`, the
//     version from `git describe --tags`, "dev" on a commit no tag reaches).
//  2. The build information the Go toolchain embeds: a binary built by `go install
//     github.com/allot-dev/allot/cmd/enforcer@v0.3.0` knows its module version, and a `go
//     build` in a git checkout (with -buildvcs, not this machine's default) its commit.
//  3. Otherwise the version is "dev" and the commit "unknown".
//
// Which way it errs: toward "dev". A pseudo-version (v0.0.0-20260101120000-abcdef123456) or
// a build of a modified tree ("+dirty") is not a release, so it reports "dev" with whatever
// commit is known, never a version that no tag names. The zero value of Info is not a
// build's; use Get. Safe for concurrent use (Get only reads).
package version

import (
	"fmt"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
)

// Set by the linker (-X); empty in a build that was not stamped.
var (
	version string
	commit  string
)

// Dev is the version of a build that no release tag names.
const Dev = "dev"

// Unknown is the commit of a build that recorded none.
const Unknown = "unknown"

// Info is one build's identity.
type Info struct {
	// Version is the release ("v0.3.0", from git describe: "v0.3.0-5-gabc1234" for five
	// commits after it, "-dirty" for a modified tree) or Dev.
	Version string
	// Commit is the full commit hash ("-dirty" appended for a modified tree) or Unknown.
	Commit string
	// Go is the Go toolchain that built the binary (runtime.Version: "go1.26.8").
	Go string
	// Platform is GOOS/GOARCH, "linux/amd64".
	Platform string
}

// Get returns this binary's Info.
func Get() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return resolve(version, commit, bi)
}

// String is what -version prints after the program's name:
// "v0.3.0 (commit 0123…, go1.26.8, linux/amd64)".
func (i Info) String() string {
	return fmt.Sprintf("%s (commit %s, %s, %s)", i.Version, i.Commit, i.Go, i.Platform)
}

// Line is the -version line of program name: "enforcer v0.3.0 (commit …, go1.26.8, linux/amd64)".
func (i Info) Line(name string) string { return name + " " + i.String() }

// resolve applies the order of the package doc to the stamped values and the embedded
// build information (nil when there is none).
func resolve(stampedVersion, stampedCommit string, bi *debug.BuildInfo) Info {
	info := Info{Version: Dev, Commit: Unknown, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi != nil {
		if v := bi.Main.Version; isRelease(v) {
			info.Version = v
		}
		var rev string
		var modified bool
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if rev != "" {
			info.Commit = rev
			if modified {
				info.Commit += "-dirty"
			}
		}
	}
	if stampedVersion != "" {
		info.Version = stampedVersion
	}
	if stampedCommit != "" {
		info.Commit = stampedCommit
	}
	return info
}

// pseudo matches the tail of a Go pseudo-version: a UTC timestamp and a 12-digit commit
// prefix (v0.0.0-20260101120000-abcdef123456, v0.3.1-0.20260101120000-abcdef123456).
var pseudo = regexp.MustCompile(`(^|[-.])\d{14}-[0-9a-f]{12}$`)

// isRelease reports whether a module version from the build information names a release:
// a semantic version that is neither "(devel)", a pseudo-version, nor a modified tree's.
func isRelease(v string) bool {
	if !strings.HasPrefix(v, "v") || strings.Contains(v, "+dirty") {
		return false
	}
	v = strings.TrimSuffix(v, "+incompatible")
	return !pseudo.MatchString(v)
}
