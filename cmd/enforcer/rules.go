package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/allot-dev/allot/pkg/enforcer/app"
	"github.com/allot-dev/allot/pkg/rules"
)

const rulesUsage = `usage: enforcer rules check [--format allot|envoy-ratelimit] [--merge-domains] PATH
       enforcer rules import [--merge-domains] DIR

check validates a rule file (format allot, the default) or a directory of
envoyproxy/ratelimit YAML files (format envoy-ratelimit) the way an enforcer loads it,
and exits 1 with every error, naming file and line.
import prints the rules equivalent to a directory of envoyproxy/ratelimit files, as a
rule file allot's loader reads (format allot).
--merge-domains merges the files of one domain (their MERGE_DOMAIN_CONFIG=true).`

// rulesCmd is `enforcer rules check` and `enforcer rules import`. Exit 0: done; 1: the
// rules are bad; 2: usage.
func rulesCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "check" && args[0] != "import") {
		fmt.Fprintln(stderr, rulesUsage)
		return 2
	}
	fs := flag.NewFlagSet("enforcer rules "+args[0], flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	format := app.FormatAllot
	if args[0] == "check" {
		fs.StringVar(&format, "format", app.FormatAllot, "allot or envoy-ratelimit")
	}
	merge := fs.Bool("merge-domains", false, "merge the files of one domain")
	err := fs.Parse(args[1:])
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "enforcer rules %s: %v\n%s\n", args[0], err, rulesUsage)
		return 2
	case fs.NArg() != 1:
		fmt.Fprintf(stderr, "enforcer rules %s takes one PATH, not %d\n%s\n", args[0], fs.NArg(), rulesUsage)
		return 2
	case format != app.FormatAllot && format != app.FormatEnvoy:
		fmt.Fprintf(stderr, "enforcer rules check: --format %q, want %s or %s\n", format, app.FormatAllot, app.FormatEnvoy)
		return 2
	case *merge && args[0] == "check" && format != app.FormatEnvoy:
		fmt.Fprintf(stderr, "enforcer rules check: --merge-domains is for --format %s\n", app.FormatEnvoy)
		return 2
	}
	path := fs.Arg(0)
	if args[0] == "import" || format == app.FormatEnvoy {
		return envoyCmd(args[0], path, *merge, stdout, stderr)
	}
	if err := rules.CheckFile(path); err != nil {
		fmt.Fprintln(stderr, strings.TrimSpace(err.Error()))
		return 1
	}
	set, err := rules.LoadFile(path)
	if err != nil { // CheckFile passed, so this cannot fail short of a race on the file
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: ok, %d rules\n", path, len(set.Rules))
	return 0
}

// envoyCmd checks or imports a directory of envoyproxy/ratelimit files: loaded and
// compiled as an enforcer with rules.format envoy-ratelimit would (warnings on stderr),
// then a summary, or the equivalent rule file, on stdout.
func envoyCmd(cmd, dir string, merge bool, stdout, stderr io.Writer) int {
	set, warnings, err := rules.LoadEnvoyDir(dir, merge)
	if err == nil {
		_, err = rules.Compile(set, rules.CompileOptions{})
	}
	if err != nil {
		fmt.Fprintln(stderr, strings.TrimSpace(err.Error()))
		return 1
	}
	for _, w := range warnings {
		fmt.Fprintln(stderr, "warning:", w)
	}
	if cmd == "import" {
		fmt.Fprintf(stdout, "# allot rules equivalent to the envoyproxy/ratelimit configuration in %s\n", dir)
		fmt.Fprintf(stdout, "# (enforcer rules import; see docs/envoy-ratelimit.md for where the answers differ)\n")
		stdout.Write(rules.EncodeSet(set))
		return 0
	}
	domains := map[string]bool{}
	for _, r := range set.Rules {
		domains[r.Match.Domain] = true
	}
	fmt.Fprintf(stdout, "%s: ok, %d domains, %d rules\n", dir, len(domains), len(set.Rules))
	return 0
}
