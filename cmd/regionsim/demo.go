package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"github.com/allot-dev/allot/pkg/appkit"
	"github.com/allot-dev/allot/pkg/inprocess"
	"github.com/allot-dev/allot/pkg/sim"
	"github.com/allot-dev/allot/pkg/sim/scenario"
	"github.com/hashicorp/go-hclog"
)

// demoCmd is `regionsim demo`: a whole three-region deployment in this process (embedded
// etcd, a balancer, each region's enforcers on an in-memory store or a real Redis
// Cluster), all talking real gRPC on loopback, and the demo scenario replayed against it
// in real time. It ends with the summary and the plots; it leaves no process behind.
func demoCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("regionsim demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("scenario", "configs/scenarios/demo.yaml", "the scenario to replay (real time)")
	out := fs.String("out", "bin/demo", "write the per-second CSV and the plots into this directory (\"\": none)")
	summary := fs.String("summary", "", "write the summary JSON to this file")
	asJSON := fs.Bool("json", false, "print the summary JSON on stdout instead of the table")
	redis := fs.String("redis", "", "region=host:port|host:port,... : run those regions' enforcers on real Redis Cluster seeds instead of the in-memory store")
	logLevel := fs.String("log-level", "warn", "log level of the stack's parts (trace, debug, info, warn, error)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "regionsim demo: unexpected arguments %q\n", fs.Args())
		return 2
	}
	sc, err := scenario.Load(*file)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	seeds, err := sim.ParseTargets(*redis)
	if err != nil {
		fmt.Fprintln(stderr, strings.Replace(err.Error(), "-targets", "-redis", 1))
		return 2
	}
	var rules bytes.Buffer
	if err := sim.RulesYAML(&rules, sc); err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	// Every process of the stack traces as the OTEL_* variables say (off without them).
	tracing, err := appkit.TracingFromEnv(os.Getenv)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	cfg := inprocess.Config{Rules: rules.Bytes(), Interval: sc.Interval, Redis: seeds, Tracing: tracing,
		Logger: hclog.New(&hclog.LoggerOptions{Name: "stack", Level: hclog.LevelFromString(*logLevel), Output: stderr})}
	for _, r := range sc.Regions {
		cfg.Regions = append(cfg.Regions, inprocess.Region{Name: r.Name, Enforcers: r.Enforcers})
		delete(seeds, r.Name)
	}
	if len(seeds) > 0 {
		fmt.Fprintf(stderr, "regionsim demo: -redis names regions the scenario does not have: %v\n", keys(seeds))
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Fprintf(stderr, "regionsim demo: starting etcd, a balancer and %d regions of enforcers in this process...\n", len(sc.Regions))
	st, err := inprocess.Start(cfg)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	defer func() {
		if err := st.Close(); err != nil {
			fmt.Fprintf(stderr, "regionsim demo: while stopping the stack: %v\n", err)
		}
	}()
	fmt.Fprintf(stderr, "\n  balancer dashboard: %s\n", st.DashboardURL())
	fmt.Fprintf(stderr, "                      (a read-only token of this demo's: without it, customers' identities are masked)\n")
	fmt.Fprintf(stderr, "  balancer metrics:   http://%s/metrics\n", st.BalancerHTTP())
	fmt.Fprintf(stderr, "  usage reports:      mutual TLS, each region with its own certificate (%s)\n", st.Certs().Dir)
	targets := st.Targets()
	for _, r := range sc.Regions {
		fmt.Fprintf(stderr, "  %-9s enforcers (gRPC): %s\n", r.Name, strings.Join(targets[r.Name], ", "))
	}
	fmt.Fprintf(stderr, "\nregionsim demo: replaying %s in real time (%v); one line a second\n", sc.Name, sc.Duration)
	res, err := sim.RunLive(ctx, sc, sim.LiveOptions{Policy: sim.PolicyBalancer, Targets: targets, Progress: stderr})
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintf(stderr, "\nregionsim demo: done; stopping the stack (the dashboard goes with it)\n\n")
	return report(res, *summary, *asJSON, *out, stdout, stderr)
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
