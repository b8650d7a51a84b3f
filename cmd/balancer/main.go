// Command balancer is the quota balancer: one of several replicas, one of which leads
// (etcd election). The leader takes the enforcers' usage reports (allot.v1.Balancer) and
// publishes each region's share of every busy identity's global limit in etcd; standbys
// redirect reports to it. See pkg/balancer for the decision and pkg/balancer/app for the
// wiring, configs/balancer.yaml for an example config.
//
//	balancer -config configs/balancer.yaml [flags]
//	balancer -config FILE [flags] -check-config         (check the configuration and the files it names)
//	balancer rules|override|shares|explain|audit ...   (the admin API's CLI: cli.go)
//	balancer certs [-dir bin/certs] [-regions ...]      (report mTLS certificates: certs.go)
//
// SIGINT/SIGTERM shut down gracefully: leadership is resigned so a standby takes over at
// once.
package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/allot-dev/allot/pkg/appkit"
	"github.com/allot-dev/allot/pkg/balancer/app"
	"github.com/allot-dev/allot/pkg/cliconf"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "certs" {
		os.Exit(certsCmd(os.Args[2:], cliEnv{getenv: os.Getenv, stdout: os.Stdout, stderr: os.Stderr}, time.Now))
	}
	if isCLI(os.Args[1:]) { // balancer rules|override|shares|explain|audit (cli.go)
		os.Exit(cli(os.Args[1:], cliEnv{getenv: os.Getenv, stdout: os.Stdout, stderr: os.Stderr}))
	}
	os.Exit(run(os.Args[1:], os.Getenv, os.Stderr))
}

func run(args []string, getenv func(string) string, stderr io.Writer) int {
	cfg, err := app.Parse(args, getenv, stderr)
	if app.IsHelp(err) {
		return 0
	}
	if cliconf.IsCheckConfig(err) {
		// Check's errors, and the answer, go to stderr: run has no stdout.
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
	a, err := app.New(cfg, log)
	if err != nil {
		log.Error("could not start", "error", err)
		return 1
	}
	return appkit.RunUntilSignal(log, a.Run, nil)
}

// environ is the process's environment, for -check-config's look at the ALLOT_* variables
// (run's getenv reads single variables); tests replace it.
var environ = os.Environ
