// Command regionsim replays traffic that moves between regions through allot and judges
// whether the global limits held (pkg/sim; scenarios under configs/scenarios/).
//
//	regionsim run -scenario FILE [-mode virtual] [-policy balancer|static|full]
//	              [-aggregate] [-summary FILE] [-json] [-out DIR]
//
//	regionsim run -scenario FILE -mode live -targets us-east=HOST:PORT,eu-west=HOST:PORT
//	regionsim rules -scenario FILE
//	regionsim demo [-scenario configs/scenarios/demo.yaml] [-out bin/demo] [-redis ...]
//	regionsim population [-keys 10000] [-seed 26] ... > configs/scenarios/long-tail.yaml
//	regionsim -version
//
// Exit status: 0 when every key met its expectations, 1 when one did not, 2 for a bad
// scenario or bad flags.
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
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/allot-dev/allot/pkg/sim"
	"github.com/allot-dev/allot/pkg/sim/scenario"
	"github.com/allot-dev/allot/pkg/version"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

const usage = `usage:
  regionsim run -scenario FILE [-mode virtual|live] [-policy balancer|static|full]
                [-aggregate] [-summary FILE] [-json] [-out DIR] [-targets us-east=ADDR,...]
  regionsim rules -scenario FILE    print the rules enforcers need for a live run
  regionsim demo [-scenario FILE] [-out DIR] [-redis region=host:port|...,...]
                 a whole three-region deployment in this process, replayed in real time
  regionsim population [-keys 10000] [-busy 20] [-middle 1000] [-seed 26] [-duration 10m]
                 [-regions us-east=3,eu-west=3,ap-south=3] [-burst rate|advised]
                 write a scenario of a realistic key population (configs/scenarios/long-tail.yaml)
  regionsim -version
                 print the version, the commit and the Go version
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "run":
		return runCmd(args[1:], stdout, stderr)
	case "rules":
		return rulesCmd(args[1:], stdout, stderr)
	case "demo":
		return demoCmd(args[1:], stdout, stderr)
	case "population":
		return populationCmd(args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	case "-version", "--version":
		fmt.Fprintln(stdout, version.Get().Line("regionsim"))
		return 0
	}
	fmt.Fprintf(stderr, "regionsim: unknown command %q\n%s", args[0], usage)
	return 2
}

func runCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("regionsim run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("scenario", "", "the scenario file (YAML; see configs/scenarios/)")
	mode := fs.String("mode", "virtual", "virtual (one process, virtual clock) or live (real time over gRPC)")
	policy := fs.String("policy", sim.PolicyBalancer, "where shares come from: balancer, static (the default split) or full (the whole limit everywhere)")
	aggregate := fs.Bool("aggregate", false, "virtual mode, -policy balancer: every region's enforcers report through a report aggregator (docs/design.md §12)")
	summary := fs.String("summary", "", "write the summary JSON to this file")
	asJSON := fs.Bool("json", false, "print the summary JSON on stdout instead of the table")
	out := fs.String("out", "", fmt.Sprintf("write the per-second CSV (every key) and the plots (SVG, PNG; of more than %d keys, the table's %d worst) into this directory", sim.TableKeys, sim.TableKeys))
	targets := fs.String("targets", "", "live mode: region=host:port of an enforcer's gRPC API, comma-separated")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof reads it)")
	memProfile := fs.String("memprofile", "", "write a heap profile at the end of the run to this file")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "regionsim run: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *file == "" {
		fmt.Fprintln(stderr, "regionsim run: -scenario is required")
		return 2
	}
	sc, err := scenario.Load(*file)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintf(stderr, "regionsim run: -cpuprofile: %v\n", err)
			return 2
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "regionsim run: -cpuprofile: %v\n", err)
			return 2
		}
		defer pprof.StopCPUProfile()
	}
	if *memProfile != "" {
		defer writeHeapProfile(*memProfile, stderr)
	}
	var res *sim.Result
	switch *mode {
	case "virtual":
		if *targets != "" {
			fmt.Fprintln(stderr, "regionsim run: -targets is for -mode live")
			return 2
		}
		// Without -out nothing reads the per-second detail: keep only what the summary needs.
		res, err = sim.Run(sc, sim.Options{Policy: *policy, SummaryOnly: *out == "", Aggregate: *aggregate})
	case "live":
		tg, perr := sim.ParseTargets(*targets)
		if perr != nil {
			fmt.Fprintln(stderr, perr)
			return 2
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		fmt.Fprintf(stderr, "regionsim: replaying %s in real time (%v) against %d regions; faults are not injected in live mode\n",
			sc.Name, sc.Duration, len(tg))
		began := time.Now()
		prog := &untilDone{ctx: ctx, w: stderr}
		res, err = sim.RunLive(ctx, sc, sim.LiveOptions{Policy: *policy, Targets: tg, Progress: prog})
		if err != nil && ctx.Err() != nil {
			fmt.Fprintln(stderr, prog.interrupted(time.Since(began), sc.Duration))
			return 1
		}
	default:
		fmt.Fprintf(stderr, "regionsim run: -mode %q: want virtual or live\n", *mode)
		return 2
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	return report(res, *summary, *asJSON, *out, stdout, stderr)
}

// writeHeapProfile writes the live heap (after a collection) for -memprofile.
func writeHeapProfile(name string, stderr io.Writer) {
	f, err := os.Create(name)
	if err == nil {
		runtime.GC()
		err = pprof.WriteHeapProfile(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "regionsim run: -memprofile: %v\n", err)
	}
}

// report writes what was asked for and returns the exit status: 0 pass, 1 fail (or 1 when
// an output could not be written, said on stderr).
func report(res *sim.Result, summary string, asJSON bool, out string, stdout, stderr io.Writer) int {
	status := 0
	if !res.Summary.Pass {
		status = 1
	}
	var js bytes.Buffer
	if err := res.WriteJSON(&js); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if summary != "" {
		if err := os.WriteFile(summary, js.Bytes(), 0o644); err != nil {
			fmt.Fprintf(stderr, "regionsim: while writing the summary: %v\n", err)
			status = 1
		}
	}
	if out != "" {
		if err := writeOut(res, out); err != nil {
			fmt.Fprintln(stderr, err)
			status = 1
		}
	}
	if asJSON {
		stdout.Write(js.Bytes())
	} else {
		res.WriteTable(stdout)
		if out != "" {
			plotted := "plots"
			if n := len(res.PlottedKeys()); n < len(res.Scenario.Keys) {
				plotted = fmt.Sprintf("plots of the %d worst keys", n)
			}
			fmt.Fprintf(stdout, "\nper-second CSV and %s in %s\n", plotted, out)
		}
	}
	return status
}

func writeOut(res *sim.Result, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("regionsim: while creating %s: %w", dir, err)
	}
	name := filepath.Join(dir, strings.ToLower(res.Scenario.Name)+"-"+res.Policy+".csv")
	f, err := os.Create(name)
	if err != nil {
		return fmt.Errorf("regionsim: %w", err)
	}
	if err := res.WriteCSV(f); err != nil {
		f.Close()
		return fmt.Errorf("regionsim: while writing %s: %w", name, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("regionsim: while writing %s: %w", name, err)
	}
	return res.WritePlots(dir)
}

func rulesCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("regionsim rules", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("scenario", "", "the scenario file")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *file == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: regionsim rules -scenario FILE")
		return 2
	}
	sc, err := scenario.Load(*file)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	if err := sim.RulesYAML(stdout, sc); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// untilDone passes progress lines to w until ctx ends (Ctrl-C): after it, RunLive would
// print every second not run as an empty row. It totals the rows it passed, for the
// summary of an interrupted run.
type untilDone struct {
	ctx context.Context
	w   io.Writer

	mu                sync.Mutex // mu guards the totals
	secs              int
	offered, admitted int64
}

var progressRow = regexp.MustCompile(`^t=\s*\d+s\s+offered\s+(\d+)/s\s+admitted\s+(\d+)/s`)

func (u *untilDone) Write(p []byte) (int, error) {
	if u.ctx.Err() != nil {
		return len(p), nil
	}
	if m := progressRow.FindSubmatch(p); m != nil {
		off, _ := strconv.ParseInt(string(m[1]), 10, 64)
		adm, _ := strconv.ParseInt(string(m[2]), 10, 64)
		u.mu.Lock()
		u.secs, u.offered, u.admitted = u.secs+1, u.offered+off, u.admitted+adm
		u.mu.Unlock()
	}
	return u.w.Write(p)
}

// interrupted is what a live run stopped early says: how far it got and what the seconds
// printed add up to. A partial run is not judged (its windows after a change would be
// cut short).
func (u *untilDone) interrupted(ran, of time.Duration) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	pct := "-"
	if u.offered > 0 {
		pct = fmt.Sprintf("%.1f%%", 100*float64(u.admitted)/float64(u.offered))
	}
	return fmt.Sprintf("regionsim: interrupted after %v of %v; the %d whole seconds above: offered %d, admitted %d (%s), all keys and regions; no verdict (a run is judged whole)",
		ran.Round(time.Second), of, u.secs, u.offered, u.admitted, pct)
}
