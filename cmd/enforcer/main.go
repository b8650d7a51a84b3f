// Command enforcer answers rate-limit checks for one region: Envoy RLS and allot.v1 over
// gRPC, JSON and forward auth over HTTP. See pkg/enforcer/app for the wiring and
// configs/regions/ for example configs.
//
//	enforcer -config configs/regions/us-east.yaml [flags]
//	enforcer -config FILE [flags] -check-config   (check the configuration and the files it names; start nothing)
//	enforcer rules check FILE
//
// SIGINT/SIGTERM shut down gracefully; SIGHUP reloads the rules file.
package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/allot-dev/allot/pkg/appkit"
	"github.com/allot-dev/allot/pkg/cliconf"
	"github.com/allot-dev/allot/pkg/enforcer/app"
	"github.com/allot-dev/allot/pkg/rules"
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
	if cliconf.IsCheckConfig(err) {
		return checkConfig(cfg, stdout, stderr)
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

// rulesCmd is `enforcer rules check FILE`: it validates FILE and exits non-zero with every
// error, naming rule, field and line.
func rulesCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) != 2 || args[0] != "check" {
		fmt.Fprintln(stderr, "usage: enforcer rules check FILE")
		return 2
	}
	path := args[1]
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

// environ is the process's environment, for -check-config's look at the ALLOT_* variables
// (run's getenv reads single variables); tests replace it.
var environ = os.Environ

// checkConfig is -check-config after Parse accepted the settings: app.Check reads the
// files they name and the environment. Exit status 0 valid, 1 not (run exits 2 before
// this when a flag, variable or config field is wrong).
func checkConfig(cfg app.Config, stdout, stderr io.Writer) int {
	if err := app.Check(cfg, environ()); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintf(stdout, "enforcer: configuration ok (region %s, store %s, rules %s)\n", cfg.Region, cfg.Store.Kind, rulesFrom(cfg))
	return 0
}

// rulesFrom says where cfg's rules come from, for -check-config's answer.
func rulesFrom(cfg app.Config) string {
	var from []string
	if cfg.Rules.File != "" {
		from = append(from, cfg.Rules.File)
	}
	if cfg.Rules.EtcdPrefix != "" {
		from = append(from, "etcd "+cfg.Rules.EtcdPrefix)
	}
	return strings.Join(from, " + ")
}
