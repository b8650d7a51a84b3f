package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// loadRow is one target's figures in one round of BenchmarkEnforcerRLS (the fields are
// described in its doc). Closed-loop figures unless named Open.
type loadRow struct {
	Target               string             `json:"target"` // "allot" or "null"
	Round                int                `json:"round"`
	LoadAvg              string             `json:"load_avg"` // /proc/loadavg at the end of the round
	Checks               int64              `json:"checks"`
	ChecksPerSec         float64            `json:"checks_per_sec"`
	ServerUsPerCheck     float64            `json:"server_us_per_check"`
	RedisUsPerCheck      float64            `json:"redis_us_per_check"`
	ClientUsPerCheck     float64            `json:"client_us_per_check"`
	RedisCallsPerCheck   float64            `json:"redis_calls_per_check"`
	ServerSysPerCheck    float64            `json:"server_syscalls_per_check"` // reads and writes, /proc/PID/io
	ClientSysPerCheck    float64            `json:"client_syscalls_per_check"`
	RefusedPct           float64            `json:"refused_pct"`
	StealPct             float64            `json:"steal_pct"`         // the machine's CPU stolen by its hypervisor, closed loop
	Sources              map[string]float64 `json:"sources_pct"`       // % of checks by source
	LeaseExpiredPct      float64            `json:"lease_expired_pct"` // % of granted tokens
	Degraded             int64              `json:"degraded_answers"`  // fallback + fail modes, both phases
	OpenRate             float64            `json:"open_rate"`
	P50ms                float64            `json:"p50_ms"`
	P90ms                float64            `json:"p90_ms"` // p90, p95, p98: the tail's shape (all stretched alike: CPU per check; p99 alone: rare slow checks)
	P95ms                float64            `json:"p95_ms"`
	P98ms                float64            `json:"p98_ms"`
	P99ms                float64            `json:"p99_ms"`
	P999ms               float64            `json:"p999_ms"`
	SendLateP99ms        float64            `json:"send_late_p99_ms"` // the generator's own lateness handing calls out (loadgen.Result.SendLate)
	OpenServerUsPerCheck float64            `json:"open_server_us_per_check"`
	ServerPeakRSSMiB     float64            `json:"server_peak_rss_mib"` // VmHWM at the end of the round's open loop
	// OpenRedisPct is the open loop's answers that waited on a call to Redis (source
	// redis), % of its checks: the checks p99 can land on when they are near 1%.
	OpenRedisPct float64 `json:"open_redis_pct"`
	// OpenLeaseEvents is allot_lease_events_total by event in the open loop, % of its checks.
	OpenLeaseEvents map[string]float64 `json:"open_lease_events_pct"`
	// RedisStallMs is, per kind of event, the longest a master was busy with one (Redis's
	// latency monitor, events of 10 ms or more) during allot's two phases of the round.
	RedisStallMs map[string]float64 `json:"redis_stall_ms"`
}

func (r *loadRow) String() string {
	return fmt.Sprintf("%.0f checks/s; server %.1f µs, redis %.1f µs, client %.1f µs per check; %.3f redis calls/check; open loop at %.0f/s p50 %.2f p90 %.2f p95 %.2f p98 %.2f p99 %.2f p99.9 %.2f ms; sources %v; lease expired %.1f%%; refused %.1f%%; degraded %d; open loop: from redis %.2f%%, lease events %% %v",
		r.ChecksPerSec, r.ServerUsPerCheck, r.RedisUsPerCheck, r.ClientUsPerCheck, r.RedisCallsPerCheck,
		r.OpenRate, r.P50ms, r.P90ms, r.P95ms, r.P98ms, r.P99ms, r.P999ms, r.Sources, r.LeaseExpiredPct, r.RefusedPct, r.Degraded, r.OpenRedisPct, r.OpenLeaseEvents)
}

// loadReport is what `make bench-load` writes to bin/bench-load.json.
type loadReport struct {
	Commit        string     `json:"commit"`   // git rev-parse HEAD, "+dirty" when the tree has changes
	Enforcer      string     `json:"enforcer"` // "built from the tree at commit", or ALLOT_BENCH_BIN
	Cores         int        `json:"cores"`    // runtime.NumCPU of the machine
	GOMAXPROCS    int        `json:"gomaxprocs"`
	Started       string     `json:"started"`
	LoadAvgBefore string     `json:"load_avg_before"`
	LoadAvgAfter  string     `json:"load_avg_after"`
	Rounds        int        `json:"rounds"`
	Callers       int        `json:"callers"`
	Conns         int        `json:"conns"`
	Keys          int        `json:"keys"`
	ZipfS         float64    `json:"zipf_s"`
	ClosedSeconds float64    `json:"closed_seconds"`
	OpenSeconds   float64    `json:"open_seconds"`
	Rows          []*loadRow `json:"rows"`
}

func (r *loadReport) write(path string) error {
	raw, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(raw, '\n'), 0o644)
}

// figure picks one number out of a row.
type figure struct {
	name   string
	format string
	get    func(*loadRow) float64
}

var loadFigures = []figure{
	{"checks/s, closed loop C=64", "%.0f", func(r *loadRow) float64 { return r.ChecksPerSec }},
	{"server CPU µs/check", "%.1f", func(r *loadRow) float64 { return r.ServerUsPerCheck }},
	{"redis CPU µs/check", "%.1f", func(r *loadRow) float64 { return r.RedisUsPerCheck }},
	{"generator CPU µs/check", "%.1f", func(r *loadRow) float64 { return r.ClientUsPerCheck }},
	{"redis calls/check", "%.3f", func(r *loadRow) float64 { return r.RedisCallsPerCheck }},
	{"server reads+writes (syscalls)/check", "%.2f", func(r *loadRow) float64 { return r.ServerSysPerCheck }},
	{"generator reads+writes (syscalls)/check", "%.2f", func(r *loadRow) float64 { return r.ClientSysPerCheck }},
	{"open loop rate (null/6) /s", "%.0f", func(r *loadRow) float64 { return r.OpenRate }},
	{"p50 ms, open loop", "%.2f", func(r *loadRow) float64 { return r.P50ms }},
	{"p99 ms, open loop", "%.2f", func(r *loadRow) float64 { return r.P99ms }},
	{"p99.9 ms, open loop", "%.2f", func(r *loadRow) float64 { return r.P999ms }},
	{"generator's send lateness p99 ms, open loop", "%.2f", func(r *loadRow) float64 { return r.SendLateP99ms }},
	{"server CPU µs/check, open loop", "%.1f", func(r *loadRow) float64 { return r.OpenServerUsPerCheck }},
	{"server peak RSS MiB (since start)", "%.0f", func(r *loadRow) float64 { return r.ServerPeakRSSMiB }},
	{"leased tokens expired unspent %", "%.1f", func(r *loadRow) float64 { return r.LeaseExpiredPct }},
	{"refused %", "%.1f", func(r *loadRow) float64 { return r.RefusedPct }},
}

// figureNamed is the figure of loadFigures with that name (the paired ratios pick theirs
// by name, not by position, so a figure added to the table cannot shift them).
func figureNamed(name string) figure {
	for _, f := range loadFigures {
		if f.name == name {
			return f
		}
	}
	panic("loadtable: no figure named " + name)
}

func (r *loadReport) rows(target string) []*loadRow {
	var out []*loadRow
	for _, row := range r.Rows {
		if row.Target == target {
			out = append(out, row)
		}
	}
	return out
}

// stat is the median and range of a figure over the rounds.
// pairedRatio is the median over the rounds of allot's figure over the null server's in
// the same round (0 if there is none).
func (r *loadReport) pairedRatio(get func(*loadRow) float64) float64 {
	a, n := r.rows("allot"), r.rows("null")
	var ratios []float64
	for i := range min(len(a), len(n)) {
		if d := get(n[i]); d != 0 {
			ratios = append(ratios, get(a[i])/d)
		}
	}
	med, _, _ := medianOf(ratios)
	return med
}

func stat(rows []*loadRow, get func(*loadRow) float64) (med, lo, hi float64) {
	v := make([]float64, len(rows))
	for i, r := range rows {
		v[i] = get(r)
	}
	return medianOf(v)
}

// medianOf is the median, least and greatest of v (sorted in place); zeros if v is empty.
func medianOf(v []float64) (med, lo, hi float64) {
	if len(v) == 0 {
		return 0, 0, 0
	}
	slices.Sort(v)
	med = v[len(v)/2]
	if len(v)%2 == 0 {
		med = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return med, v[0], v[len(v)-1]
}

// medians is a row of the medians over the rounds of target's figures.
func (r *loadReport) medians(target string) *loadRow {
	rows := r.rows(target)
	m := func(get func(*loadRow) float64) float64 { v, _, _ := stat(rows, get); return v }
	return &loadRow{Target: target,
		ChecksPerSec:       m(func(r *loadRow) float64 { return r.ChecksPerSec }),
		ServerUsPerCheck:   m(func(r *loadRow) float64 { return r.ServerUsPerCheck }),
		RedisCallsPerCheck: m(func(r *loadRow) float64 { return r.RedisCallsPerCheck }),
		P99ms:              m(func(r *loadRow) float64 { return r.P99ms }),
	}
}

// table is the one table `make bench-load` prints: per figure, allot and the null server
// (median and range over the rounds) and the ratio of the medians; then the answers by
// source, per round.
func (r *loadReport) table() string {
	var sb strings.Builder
	a, n := r.rows("allot"), r.rows("null")
	cell := func(rows []*loadRow, f figure) string {
		med, lo, hi := stat(rows, f.get)
		if len(rows) == 1 || lo == hi {
			return fmt.Sprintf(f.format, med)
		}
		return fmt.Sprintf(f.format+" ("+f.format+"–"+f.format+")", med, lo, hi)
	}
	fmt.Fprintf(&sb, "\nload benchmark: commit %s, enforcer %s, %d cores (GOMAXPROCS %d), %d rounds, load average %s before, %s after\n\n",
		r.Commit, r.Enforcer, r.Cores, r.GOMAXPROCS, r.Rounds, r.LoadAvgBefore, r.LoadAvgAfter)
	fmt.Fprintf(&sb, "| figure | allot, median (range) | null RLS server, median (range) | allot / null |\n|---|---|---|---|\n")
	for _, f := range loadFigures {
		am, _, _ := stat(a, f.get)
		nm, _, _ := stat(n, f.get)
		ratio := "—"
		if nm != 0 {
			ratio = fmt.Sprintf("%.2f×", am/nm)
		}
		nc := cell(n, f)
		if nm == 0 {
			nc, ratio = "—", "—"
		}
		fmt.Fprintf(&sb, "| %s | %s | %s | %s |\n", f.name, cell(a, f), nc, ratio)
	}
	// Ratios within each round: both targets ran minutes apart on the same machine, so these
	// are steadier than the ratio of the medians when the machine's load moves.
	// The last column is their median: the paired estimate, which this table's verdicts read.
	for _, f := range []figure{figureNamed("checks/s, closed loop C=64"), figureNamed("server CPU µs/check"), figureNamed("p99 ms, open loop")} {
		var per []string
		for i := range min(len(a), len(n)) {
			if d := f.get(n[i]); d != 0 {
				per = append(per, fmt.Sprintf("%.2f×", f.get(a[i])/d))
			}
		}
		fmt.Fprintf(&sb, "| %s, allot / null per round | %s | — | median %.2f× |\n", f.name, strings.Join(per, ", "), r.pairedRatio(f.get))
	}
	var srcs []string
	for _, row := range a {
		for s := range row.Sources {
			if !slices.Contains(srcs, s) {
				srcs = append(srcs, s)
			}
		}
	}
	slices.Sort(srcs)
	for _, s := range srcs {
		var per []string
		for _, row := range a {
			per = append(per, fmt.Sprintf("%.2f", row.Sources[s]))
		}
		fmt.Fprintf(&sb, "| answers from %s %%, per round | %s | — | — |\n", s, strings.Join(per, ", "))
	}
	var steal []string
	for i := range min(len(a), len(n)) {
		steal = append(steal, fmt.Sprintf("%.1f / %.1f", a[i].StealPct, n[i].StealPct))
	}
	fmt.Fprintf(&sb, "| CPU stolen by the hypervisor %%, closed loop, allot / null per round | %s | — | — |\n", strings.Join(steal, ", "))
	var open []string
	for _, row := range a {
		open = append(open, fmt.Sprintf("%.2f", row.OpenRedisPct))
	}
	fmt.Fprintf(&sb, "| open loop: answers from redis %%, per round | %s | — | — |\n", strings.Join(open, ", "))
	var why []string
	for _, row := range a {
		var parts []string
		for _, ev := range []string{"new", "expired", "spent", "exact"} {
			parts = append(parts, fmt.Sprintf("%s %.2f", ev, row.OpenLeaseEvents["call-"+ev]))
		}
		why = append(why, strings.Join(parts, " "))
	}
	fmt.Fprintf(&sb, "| open loop: checks that waited on a call, by why (%% of checks: key new, lease expired, spent, not leased), per round | %s | — | — |\n", strings.Join(why, "; "))
	var deg []string
	for _, row := range a {
		deg = append(deg, fmt.Sprint(row.Degraded))
	}
	fmt.Fprintf(&sb, "| answers from fallback or a fail mode (count, both phases), per round | %s | — | — |\n", strings.Join(deg, ", "))
	var stalls []string
	for _, row := range a {
		var ev []string
		for _, name := range slices.Sorted(maps.Keys(row.RedisStallMs)) {
			ev = append(ev, fmt.Sprintf("%s %.0f", name, row.RedisStallMs[name]))
		}
		if len(ev) == 0 {
			ev = []string{"none"}
		}
		stalls = append(stalls, strings.Join(ev, " "))
	}
	fmt.Fprintf(&sb, "| Redis busy ≥ %d ms in allot's phases (event max ms), per round | %s | — | — |\n", redisStallMs, strings.Join(stalls, "; "))
	var loads []string
	for _, row := range a {
		loads = append(loads, row.LoadAvg)
	}
	fmt.Fprintf(&sb, "\nload average at the end of each round: %s\n", strings.Join(loads, "; "))
	return sb.String()
}

// loadAvg is the first three fields of /proc/loadavg.
func loadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// gitCommit is the commit the benchmark ran at, "+dirty" when the tree had changes.
func gitCommit() string {
	out, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(strings.TrimSpace(string(st))) > 0 {
		c += "+dirty"
	}
	return c
}
