package e2e

import (
	"crypto/tls"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/testenv"
)

// BenchmarkBalancerScale is `make bench-scale` (issue 26 §2): one balancer leader at the
// fan-in of docs/design.md §12 — about 1,000 enforcers (330 gateways × 3 regions), each
// reporting up to 10,000 identities every interval — or as far towards it as the machine
// goes.
//
// What runs. A real bin/balancer process (built here from the tree, a child so its CPU and
// memory are read from /proc) on a real etcd in a container (pkg/testenv), with the
// shipped defaults but the interval, over mutual TLS as shipped. A fleet of simulated
// enforcers in this process drives it over gRPC: each is a real usage table and Reporter
// (pkg/enforcer/report), with its region's certificate, fed a synthetic Zipf key mix
// (scalefleet_test.go) on a clock that is the end of what it has been fed (so a busy
// machine delays its reports, not the traffic in them), and each region's enforcers apply
// the published share sets through
// a real overrides.Watcher and Holder on etcd (one per region, shared by the region's
// simulated enforcers): their reports acknowledge the versions they apply, which the
// balancer's change plan waits for, exactly as a real enforcer's do.
//
// Steps. A step is E enforcers (a third a region, their starts spread over one interval)
// reporting I identities each per interval: a fresh balancer (new etcd prefixes), the
// fleet started, ALLOT_SCALE_WARM intervals not measured (the first recompute and the
// first, largest publication land there), then ALLOT_SCALE_MEASURE intervals measured. The
// steps come in sequences, each scaling one thing; a sequence stops at the first step
// whose report p99 is over 1 s or in which a report was refused (a failed attempt,
// client side), and the table says which. The default (ALLOT_SCALE_STEPS):
//
//	enforcers=10x1000,30x1000,100x1000,200x1000,300x1000,1000x1000
//	          enforcers, 1,000 identities each
//	identities=30x3000,30x6000,30x10000
//	          identities per report, 30 enforcers
//	overlap=30x1000/10000,100x1000/10000,200x1000/10000,300x1000/10000,1000x1000/10000
//	          enforcers over one population of 10,000 keys
//
// In a step written ExI each enforcer's tail keys are its own, so the leader tracks
// about E × I identities; ExI/P draws every tail from one population of P keys, so the
// reports grow while the identities tracked stay near P (a key reported by E × I / P
// enforcers, as a busy key is by every gateway that serves it).
//
// The key mix. Per enforcer: min(100, I/10) hot keys, shared by the whole fleet, Zipf
// (s = 1.1) over ALLOT_SCALE_RATE requests/s per enforcer, each with a home region that
// sends 60% of its traffic (20% from each other region), the top five over the rule's
// limit (refused, reported under pressure); the rest of its I identities are tail keys
// seen 1–4 times an interval (Zipf in their rank) by this enforcer only, under their
// limit. Hot keys are fed every 250 ms (the table's recent-rate slot), tail keys once an
// interval each, spread over its slots, so the recent rates the balancer's shift
// detector reads are those of steady traffic. Admitted and refused are decided against
// the region's share as the region's watcher applies it (the regional limit split evenly
// over the region's enforcers for hot keys, the whole regional limit for a tail key). One
// more identity, the probe (its own rule, 100/s × E), sends 0.9 of its limit from
// us-east until the measured window starts, then from eu-west: the time from the first
// report that carries the move to the probe's shares reaching the regions' watchers is
// the control plane's round trip at that fan-in.
//
// Figures per step (scaletable_test.go prints one table, writes it as JSON to
// ALLOT_SCALE_JSON; `make bench-scale`: bin/bench-scale.json). "Per interval" is per
// reporting interval of this run (ALLOT_SCALE_INTERVAL); a fan-in of E × I identities
// per interval costs the leader about the same per interval at the design's 10 s (a
// report's ingestion per identity-report, one recompute per interval), so per-interval
// figures carry over and per-second ones scale by interval/10 s.
//
//	identity-reports / interval  Σ identities in the reports the leader accepted, per interval
//	reports / enforcer-interval  reports accepted per enforcer per interval (> 1: the
//	                             acknowledgements and early reports on top of the regular one)
//	leader CPU s / interval      the balancer's utime+stime (/proc/PID/stat) per interval
//	leader µs / identity-report  the same over identity-reports
//	leader RSS MiB               VmRSS at the end of the window (peak VmHWM since start)
//	report p50/p99/max ms        each accepted Report call, from sending to the leader's
//	                             answer (encoding, the RPC, the leader's decoding and
//	                             ingestion; an interceptor in ReporterConfig.DialOptions)
//	refused                      report attempts that failed (timeout, error, refusal), and
//	                             reports dropped after their retry; warm-up's apart
//	recompute ms                 the balancer's allot_balancer_recompute_seconds: count,
//	                             mean, and the bucket bound of the slowest
//	versions / interval          allot_balancer_share_version's growth per interval
//	etcd KB / interval           allot_balancer_etcd_write_bytes_total (chunks + heads)
//	etcd CPU s / interval        the etcd member's process_cpu_seconds_total per interval
//	report → share s             from sending the first report (us-east's or eu-west's,
//	                             accepted) drained after the probe moved, to the first
//	                             version that lowered us-east's share (under 0.5, and by 0.1
//	                             at least) applied in us-east, and to eu-west's raised to
//	                             ≥ 0.9 applied in eu-west (the move done: decrease,
//	                             acknowledgements, increase); "not settled" when us-east did
//	                             not hold ≥ 0.9 of the probe when it moved (warm-up too short
//	                             for the leader to have moved it there)
//	tracked / listed             allot_balancer_identities at the end of the window
//	waiting for a CPU s/interval the leader's threads' (and this process's) time runnable
//	                             but not running (/proc/PID/task/*/schedstat): what the
//	                             machine's other work took from the latencies above
//	generator cores              this process's CPU per second: it shares the machine
//
// Before the steps, the enforcer's apply path on share sets of ALLOT_SCALE_APPLY entries
// (default 10000,100000,1000000; "0" skips it) in this process (scaleapply_test.go): the
// set laid out in chunks by the balancer's Chunker, decoded and applied to a Holder as the
// Watcher does (time and CPU, and the heap the mirror and the table keep), and a new
// version in which one chunk changed.
//
// Knobs: ALLOT_SCALE_STEPS (above), ALLOT_SCALE_INTERVAL (default 2s; the design's 10s
// makes every step five times longer), ALLOT_SCALE_WARM and ALLOT_SCALE_MEASURE (intervals,
// default 5 and 5), ALLOT_SCALE_RATE (requests/s per enforcer, default 1000),
// ALLOT_SCALE_BUDGET (default 11m: a step that would start later is skipped and said so),
// ALLOT_SCALE_BIN (a prebuilt balancer instead of building ./cmd/balancer),
// ALLOT_SCALE_ARGS (flags added to the balancer's, e.g. "-log-level debug -min-version-gap 5s"),
// ALLOT_SCALE_LOG=1 (print each balancer's stderr; a directory: write it there, one file a
// step), ALLOT_SCALE_APPLY, ALLOT_SCALE_JSON.
// The fleet's memory grows with E × I (about 0.5 KB per pair of a usage table, two tables
// an enforcer): a step above 3,000,000 identity-reports per interval is refused unless
// ALLOT_SCALE_MAX_PAIRS raises that bound. Skipped under -short.
func BenchmarkBalancerScale(b *testing.B) {
	if testing.Short() {
		b.Skip("scale benchmark: needs Docker and a built balancer")
	}
	testenv.Require(b)
	k, err := scaleKnobsFrom(os.Getenv)
	if err != nil {
		b.Fatal(err)
	}
	// The fleet allocates per interval what a thousand enforcers would; at Go's default the
	// collector would take a good part of the CPU the leader is measured on.
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	began := time.Now()
	etcd := testenv.Etcd(b, 1)
	files := testenv.Certs(b, "", scaleRegions...)
	dir := b.TempDir()
	bin := k.bin
	if bin == "" {
		bin = filepath.Join(dir, "balancer")
		if out, err := exec.Command("go", "build", "-o", bin, "github.com/allot-dev/allot/cmd/balancer").CombinedOutput(); err != nil {
			b.Fatalf("while building the balancer: %v\n%s", err, out)
		}
	}
	rep := &scaleReport{Commit: gitCommit(), Balancer: "built from the tree at commit", Cores: runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0), Started: time.Now().UTC().Format(time.RFC3339), LoadAvgBefore: loadAvg(),
		IntervalS: k.interval.Seconds(), WarmIntervals: k.warm, MeasureIntervals: k.measure, RatePerEnforcer: k.rate}
	if k.bin != "" {
		rep.Balancer = k.bin
	}
	// The enforcer's apply path first, while this process's heap holds nothing else.
	var applied []*applyResult
	for _, n := range k.apply {
		a := measureApply(b, n)
		b.Logf("apply %d entries: %+v", n, *a)
		applied = append(applied, a)
	}
	env := &scaleEnv{b: b, etcd: etcd, files: files, bin: bin, dir: dir, knobs: k, tls: map[string]*tls.Config{}}
	for _, r := range scaleRegions {
		env.tls[r] = testenv.EnforcerTLS(b, files, r)
	}
	for range b.N {
		for _, seq := range k.seqs {
			stopped := ""
			for _, st := range seq.steps {
				row := &scaleRow{Sequence: seq.name, Enforcers: st.enforcers, IdentitiesPerReport: st.ids, Population: st.population}
				switch {
				case stopped != "":
					row.Skipped = "sequence stopped at " + stopped
				case time.Since(began) > k.budget:
					row.Skipped = fmt.Sprintf("over the run's budget (%v)", k.budget)
				default:
					env.run(st, row)
					b.Logf("%s", row)
					if why := row.failed(); why != "" {
						row.Stop = why
						stopped = fmt.Sprintf("%dx%d: %s", st.enforcers, st.ids, why)
					}
				}
				rep.Rows = append(rep.Rows, row)
			}
		}
	}
	rep.Apply = applied
	rep.LoadAvgAfter = loadAvg()
	rep.WallS = time.Since(began).Seconds()
	rep.Extrapolation = rep.extrapolate()
	fmt.Print(rep.table())
	if k.json != "" {
		if err := rep.write(k.json); err != nil {
			b.Errorf("while writing %s: %v", k.json, err)
		}
	}
	if best := rep.largestHeld(); best != nil {
		b.ReportMetric(best.IdentityReportsPerInterval, "held-identity-reports/interval")
		b.ReportMetric(best.LeaderUsPerIdentityReport, "leader-µs/identity-report")
	}
}

// scaleRegions are the regions of every step (the shipped three).
var scaleRegions = []string{"us-east", "eu-west", "ap-south"}

// scaleStep is one step of a sequence: enforcers × identities per report, over a
// population of keys (0: each enforcer's tail keys its own).
type scaleStep struct{ enforcers, ids, population int }

type scaleSeq struct {
	name  string
	steps []scaleStep
}

// scaleKnobs are the benchmark's settings (the ALLOT_SCALE_* variables).
type scaleKnobs struct {
	seqs          []scaleSeq
	interval      time.Duration
	warm, measure int
	rate          float64
	budget        time.Duration
	maxPairs      int
	apply         []int
	bin, json     string
	balancerArgs  []string
	log           string
	startTimeout  time.Duration
}

const defaultScaleSteps = "enforcers=10x1000,30x1000,100x1000,200x1000,300x1000,1000x1000 " +
	"identities=30x3000,30x6000,30x10000 " +
	"overlap=30x1000/10000,100x1000/10000,200x1000/10000,300x1000/10000,1000x1000/10000"

// scaleKnobsFrom reads the ALLOT_SCALE_* variables through getenv; an error names the
// variable and what was wrong with it.
func scaleKnobsFrom(getenv func(string) string) (scaleKnobs, error) {
	k := scaleKnobs{interval: 2 * time.Second, warm: 5, measure: 5, rate: 1000, budget: 11 * time.Minute,
		maxPairs: 3_000_000, apply: []int{10_000, 100_000, 1_000_000}, startTimeout: 30 * time.Second,
		bin: getenv("ALLOT_SCALE_BIN"), json: getenv("ALLOT_SCALE_JSON"), log: getenv("ALLOT_SCALE_LOG"),
		balancerArgs: strings.Fields(getenv("ALLOT_SCALE_ARGS"))}
	var err error
	dur := func(name string, into *time.Duration) {
		if v := getenv(name); v != "" && err == nil {
			d, e := time.ParseDuration(v)
			if e != nil || d <= 0 {
				err = fmt.Errorf("%s = %q: want a positive duration such as 2s", name, v)
				return
			}
			*into = d
		}
	}
	num := func(name string, into *int, least int) {
		if v := getenv(name); v != "" && err == nil {
			n, e := strconv.Atoi(v)
			if e != nil || n < least {
				err = fmt.Errorf("%s = %q: want an integer >= %d", name, v, least)
				return
			}
			*into = n
		}
	}
	dur("ALLOT_SCALE_INTERVAL", &k.interval)
	dur("ALLOT_SCALE_BUDGET", &k.budget)
	num("ALLOT_SCALE_WARM", &k.warm, 1)
	num("ALLOT_SCALE_MEASURE", &k.measure, 1)
	num("ALLOT_SCALE_MAX_PAIRS", &k.maxPairs, 1)
	if v := getenv("ALLOT_SCALE_RATE"); v != "" && err == nil {
		f, e := strconv.ParseFloat(v, 64)
		if e != nil || !(f > 0) || f > 1e6 {
			err = fmt.Errorf("ALLOT_SCALE_RATE = %q: want requests/s per enforcer in (0, 1e6]", v)
		}
		k.rate = f
	}
	if err != nil {
		return k, err
	}
	if k.interval < time.Second || k.interval%report250ms != 0 {
		return k, fmt.Errorf("ALLOT_SCALE_INTERVAL = %v: want at least 1s, a whole number of 250ms slots", k.interval)
	}
	if v := getenv("ALLOT_SCALE_APPLY"); v != "" {
		k.apply = nil
		for _, f := range strings.Split(v, ",") {
			n, e := strconv.Atoi(strings.TrimSpace(f))
			if e != nil || n < 0 || n > 5_000_000 {
				return k, fmt.Errorf("ALLOT_SCALE_APPLY: %q: want entries in [0, 5000000], comma-separated (0 skips)", f)
			}
			if n > 0 {
				k.apply = append(k.apply, n)
			}
		}
	}
	steps := getenv("ALLOT_SCALE_STEPS")
	if steps == "" {
		steps = defaultScaleSteps
	}
	k.seqs, err = parseScaleSteps(steps, k.maxPairs)
	return k, err
}

// report250ms is the usage table's recent-rate slot (report.RecentSlot): the fleet feeds
// its hot keys once a slot, so an interval is a whole number of them.
const report250ms = 250 * time.Millisecond

// parseScaleSteps reads "name=ExI,ExI/P name=...": sequences separated by spaces, each a
// name and its steps.
func parseScaleSteps(s string, maxPairs int) ([]scaleSeq, error) {
	var out []scaleSeq
	for _, field := range strings.Fields(s) {
		name, list, ok := strings.Cut(field, "=")
		if !ok || name == "" || list == "" {
			return nil, fmt.Errorf("ALLOT_SCALE_STEPS: %q: want name=EnforcersxIdentities[/Population],...", field)
		}
		seq := scaleSeq{name: name}
		for _, st := range strings.Split(list, ",") {
			step, err := parseScaleStep(st, maxPairs)
			if err != nil {
				return nil, fmt.Errorf("ALLOT_SCALE_STEPS: sequence %s: %w", name, err)
			}
			seq.steps = append(seq.steps, step)
		}
		out = append(out, seq)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("ALLOT_SCALE_STEPS: no sequence in %q", s)
	}
	return out, nil
}

func parseScaleStep(s string, maxPairs int) (scaleStep, error) {
	var st scaleStep
	ei, pop, hasPop := strings.Cut(s, "/")
	e, i, ok := strings.Cut(ei, "x")
	var err1, err2, err3 error
	st.enforcers, err1 = strconv.Atoi(e)
	st.ids, err2 = strconv.Atoi(i)
	if hasPop {
		st.population, err3 = strconv.Atoi(pop)
	}
	switch {
	case !ok || err1 != nil || err2 != nil || err3 != nil:
		return st, fmt.Errorf("step %q: want EnforcersxIdentities or EnforcersxIdentities/Population, e.g. 100x1000", s)
	case st.enforcers < len(scaleRegions) || st.enforcers > 3000:
		return st, fmt.Errorf("step %q: %d enforcers, want %d to 3000 (at least one a region)", s, st.enforcers, len(scaleRegions))
	case st.ids < 10 || st.ids > 10_000:
		return st, fmt.Errorf("step %q: %d identities per report, want 10 to 10000 (the balancer's max_entries)", s, st.ids)
	case st.enforcers*st.ids > maxPairs:
		return st, fmt.Errorf("step %q: %d identity-reports per interval, more than ALLOT_SCALE_MAX_PAIRS %d (the fleet's memory: about 0.5 KB a pair, in this process)",
			s, st.enforcers*st.ids, maxPairs)
	case hasPop && st.population <= hotKeys(st.ids):
		return st, fmt.Errorf("step %q: population %d, want more than the %d hot keys", s, st.population, hotKeys(st.ids))
	}
	return st, nil
}

// hotKeys is how many of an enforcer's ids identities are the fleet's shared hot keys.
func hotKeys(ids int) int { return min(100, ids/10) }
