// Command enforcer answers rate-limit checks for one region: Envoy RLS and allot.v1 over
// gRPC, JSON and forward auth over HTTP. See pkg/enforcer/app for the wiring and
// configs/regions/ for example configs.
//
//	enforcer -config configs/regions/us-east.yaml [flags]
//	enforcer rules check [--format allot|envoy-ratelimit] [--merge-domains] PATH
//	enforcer rules import [--merge-domains] DIR
//
// SIGINT/SIGTERM shut down gracefully; SIGHUP reloads the rules file.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/allot-dev/allot/pkg/appkit"
	"github.com/allot-dev/allot/pkg/enforcer/app"
)

func main() { os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr)) }

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "rules" {
		return rulesCmd(args[1:], stdout, stderr)
	}
	cfg, err := app.Parse(args, getenv, stderr)
	if app.IsHelp(err) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	log := appkit.Logger("enforcer", cfg.LogLevel, cfg.LogJSON, stderr)
	gc, stopGC := app.ApplyRuntime(&cfg, getenv)
	defer stopGC()
	log.Info("go runtime", "gc", gc)
	a, err := app.New(cfg, log)
	if err != nil {
		log.Error("could not start", "error", err)
		return 1
	}
	return appkit.RunUntilSignal(log, a.Run, func() {
		if err := a.Reload(); err != nil {
			log.Error("reload refused; the rules in force keep serving", "error", err)
		} else {
			log.Info("reloaded", "rules", a.Rules().Current().Version())
		}
	})
}
