// Command balancer is the quota balancer: one of several replicas, one of which leads
// (etcd election). The leader takes the enforcers' usage reports (allot.v1.Balancer) and
// publishes each region's share of every busy identity's global limit in etcd; standbys
// redirect reports to it. See pkg/balancer for the decision and pkg/balancer/app for the
// wiring, configs/balancer.yaml for an example config.
//
//	balancer -config configs/balancer.yaml [flags]
//	balancer rules|override|shares|explain|audit ...   (the admin API's CLI: cli.go)
//	balancer certs [-dir bin/certs] [-regions ...]      (report mTLS certificates: certs.go)
//	balancer probe [flags]                              (a health check: GET /readyz, exit 0 when ready)
//	balancer -version
//
// SIGINT/SIGTERM shut down gracefully: leadership is resigned so a standby takes over at
// once.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/allot-dev/allot/pkg/appkit"
	"github.com/allot-dev/allot/pkg/balancer/app"
	"github.com/allot-dev/allot/pkg/cliconf"
	"github.com/allot-dev/allot/pkg/version"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "certs" {
		os.Exit(certsCmd(os.Args[2:], cliEnv{getenv: os.Getenv, stdout: os.Stdout, stderr: os.Stderr}, time.Now))
	}
	if isCLI(os.Args[1:]) { // balancer rules|override|shares|explain|audit (cli.go)
		os.Exit(cli(os.Args[1:], cliEnv{getenv: os.Getenv, stdout: os.Stdout, stderr: os.Stderr}))
	}
	if len(os.Args) > 1 && os.Args[1] == "probe" {
		os.Exit(probeCmd(os.Args[2:], os.Getenv, os.Stdout, os.Stderr))
	}
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cfg, err := app.Parse(args, getenv, stderr)
	if app.IsHelp(err) {
		return 0
	}
	if errors.Is(err, cliconf.ErrVersion) {
		fmt.Fprintln(stdout, version.Get().Line("balancer"))
		return 0
	}
	if cliconf.IsCheckConfig(err) {
		// Check's errors, and the answer, go to stderr, as the process's logs do.
		if err := app.Check(cfg, environ()); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		fmt.Fprintf(stderr, "balancer: configuration ok (regions %s, etcd %s)\n", strings.Join(cfg.Regions, ","), strings.Join(cfg.Etcd.Endpoints, ","))
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	log := appkit.Logger("balancer", cfg.LogLevel, cfg.LogJSON, stderr)
	v := version.Get()
	log.Info("starting", "version", v.Version, "commit", v.Commit, "go", v.Go)
	appkit.LogOTelErrors(log.Named("otel"))
	a, err := app.New(cfg, log)
	if err != nil {
		log.Error("could not start", "error", err)
		return 1
	}
	return appkit.RunUntilSignal(log, a.Run, nil)
}

// probeCmd is `balancer probe [flags]`: GET /readyz on the HTTP address that the flags,
// ALLOT_CONFIG and the ALLOT_* variables give (as the balancer reads them, unvalidated),
// on loopback, over TLS when admin.tls puts it there. A standby is ready. Exit 0 when
// ready (the answer, "ready: leader" or "ready: standby", on stdout), 1 when not or
// unreachable (why on stderr), 2 for bad flags.
func probeCmd(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cfg, err := app.ParseUnchecked(args, getenv, stderr)
	if app.IsHelp(err) {
		return 0
	}
	if errors.Is(err, cliconf.ErrVersion) {
		fmt.Fprintln(stdout, version.Get().Line("balancer"))
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	return appkit.ProbeCommand("balancer", cfg.Listen.HTTP, cfg.HTTPOverTLS(), stdout, stderr)
}

// environ is the process's environment, for -check-config's look at the ALLOT_* variables
// (run's getenv reads single variables); tests replace it.
var environ = os.Environ
