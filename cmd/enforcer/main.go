// Command enforcer answers rate-limit checks for one region: Envoy RLS and allot.v1 over
// gRPC, JSON and forward auth over HTTP. See pkg/enforcer/app for the wiring and
// configs/regions/ for example configs.
//
//	enforcer -config configs/regions/us-east.yaml [flags]
//	enforcer -config FILE [flags] -check-config   (check the configuration and the files it names; start nothing)
//	enforcer rules check [--format allot|envoy-ratelimit] [--merge-domains] PATH
//	enforcer rules import [--merge-domains] DIR
//	enforcer probe [flags]     (the image's health check: GET /readyz, exit 0 when ready)
//	enforcer -version
//
// SIGINT/SIGTERM shut down gracefully; SIGHUP reloads the rules file.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/hashicorp/go-hclog"

	"github.com/allot-dev/allot/pkg/appkit"
	"github.com/allot-dev/allot/pkg/cliconf"
	"github.com/allot-dev/allot/pkg/enforcer/app"
	"github.com/allot-dev/allot/pkg/version"
)

func main() { os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr)) }

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "rules" {
		return rulesCmd(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "probe" {
		return probeCmd(args[1:], getenv, stdout, stderr)
	}
	cfg, err := app.Parse(args, getenv, stderr)
	if app.IsHelp(err) {
		return 0
	}
	if errors.Is(err, cliconf.ErrVersion) {
		fmt.Fprintln(stdout, version.Get().Line("enforcer"))
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
	v := version.Get()
	log.Info("starting", "version", v.Version, "commit", v.Commit, "go", v.Go)
	logCompat(log, cfg.EnvoyCompat)
	appkit.LogOTelErrors(log.Named("otel"))
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

// probeCmd is `enforcer probe [flags]`: GET /readyz on the HTTP address that the flags,
// ALLOT_CONFIG and the ALLOT_* variables give (as the enforcer reads them, unvalidated),
// on loopback. Exit 0 when ready (the answer on stdout), 1 when not or unreachable (why
// on stderr), 2 for bad flags.
func probeCmd(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cfg, err := app.ParseUnchecked(args, getenv, stderr)
	if app.IsHelp(err) {
		return 0
	}
	if errors.Is(err, cliconf.ErrVersion) {
		fmt.Fprintln(stdout, version.Get().Line("enforcer"))
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	return appkit.ProbeCommand("enforcer", cfg.Listen.HTTP, false, stdout, stderr)
}

// environ is the process's environment, for -check-config's look at the ALLOT_* variables
// (run's getenv reads single variables); tests replace it.
var environ = os.Environ

// checkConfig is -check-config after Parse accepted the settings: app.Check reads the
// files they name and the environment. Exit status 0 valid, 1 not (run exits 2 before
// this when a flag, variable or config field is wrong).
func checkConfig(cfg app.Config, stdout, stderr io.Writer) int {
	printCompat(stderr, cfg.EnvoyCompat)
	if err := app.Check(cfg, environ()); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintf(stdout, "enforcer: configuration ok (region %s, store %s, rules %s)\n", cfg.Region, cfg.Store.Kind, rulesFrom(cfg))
	return 0
}

// logCompat says at start what was done with envoyproxy/ratelimit's variables: each one
// honoured, each one set that is not (a warning naming it), and their variables set
// while the compatibility layer is off.
func logCompat(log hclog.Logger, r app.CompatReport) {
	if r.On {
		log.Info("envoyproxy/ratelimit compatibility: their environment variables are read", "why", r.Why)
		for _, a := range r.Applied {
			log.Info("envoyproxy/ratelimit setting honoured", "setting", a)
		}
	}
	for _, u := range r.Unsupported {
		name, why, _ := strings.Cut(u, ": ")
		log.Warn("envoyproxy/ratelimit setting not supported by allot", "variable", name, "why", why)
	}
	if len(r.Ignored) > 0 {
		log.Warn("envoyproxy/ratelimit variables set but not read (compatibility off)", "variables", strings.Join(r.Ignored, ","), "why", r.Why)
	}
}

// printCompat is logCompat for -check-config: a line per finding, on stderr.
func printCompat(w io.Writer, r app.CompatReport) {
	if r.On {
		fmt.Fprintf(w, "enforcer: envoyproxy/ratelimit compatibility on (%s)\n", r.Why)
		for _, a := range r.Applied {
			fmt.Fprintf(w, "enforcer: honoured: %s\n", a)
		}
	}
	for _, u := range r.Unsupported {
		fmt.Fprintf(w, "enforcer: warning: envoyproxy/ratelimit variable %s\n", u)
	}
	if len(r.Ignored) > 0 {
		fmt.Fprintf(w, "enforcer: warning: envoyproxy/ratelimit variables %s set but not read: %s\n", strings.Join(r.Ignored, ", "), r.Why)
	}
}

// rulesFrom says where cfg's rules come from, for -check-config's answer.
func rulesFrom(cfg app.Config) string {
	var from []string
	if cfg.Rules.File != "" {
		from = append(from, cfg.Rules.File)
	}
	if cfg.Rules.Dir != "" {
		from = append(from, cfg.Rules.Format+" "+cfg.Rules.Dir)
	}
	if x := cfg.Rules.XDS; x.Server != "" && cfg.Rules.Format == app.FormatEnvoy {
		from = append(from, cfg.Rules.Format+" xds "+x.Server)
	}
	if cfg.Rules.EtcdPrefix != "" {
		from = append(from, "etcd "+cfg.Rules.EtcdPrefix)
	}
	return strings.Join(from, " + ")
}
