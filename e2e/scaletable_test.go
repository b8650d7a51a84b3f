package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// scaleRow is one step of BenchmarkBalancerScale (its doc describes the figures). Window
// figures unless named Warm.
type scaleRow struct {
	Sequence            string  `json:"sequence"`
	Enforcers           int     `json:"enforcers"`
	IdentitiesPerReport int     `json:"identities_per_report"`
	Population          int     `json:"population,omitempty"` // 0: each enforcer's tail keys its own
	HotKeys             int     `json:"hot_keys"`
	LimitPerSec         float64 `json:"limit_per_sec"` // the default rule's global rate
	Skipped             string  `json:"skipped,omitempty"`
	Stop                string  `json:"stop,omitempty"` // why its sequence stopped here
	StartS              float64 `json:"start_s"`        // starting the fleet (one interval, spread)
	MeasuredS           float64 `json:"measured_s"`
	Intervals           float64 `json:"intervals"`

	IdentityReports            int64   `json:"identity_reports"` // in the reports the leader accepted
	IdentityReportsPerInterval float64 `json:"identity_reports_per_interval"`
	DrainedPerInterval         float64 `json:"identity_reports_drained_per_interval"` // in every report drained, accepted or not
	ReportsPerEnforcerInterval float64 `json:"reports_per_enforcer_interval"`
	EarlyPerInterval           float64 `json:"early_reports_per_interval"`
	Reports                    int     `json:"reports_accepted"`
	Tracked                    int     `json:"identities_tracked"`
	Listed                     int     `json:"identities_listed"`

	LeaderCPUPerInterval      float64 `json:"leader_cpu_s_per_interval"`
	LeaderCores               float64 `json:"leader_cores"`
	LeaderUsPerIdentityReport float64 `json:"leader_us_per_identity_report"`
	LeaderRSSMiB              float64 `json:"leader_rss_mib"`
	LeaderPeakRSSMiB          float64 `json:"leader_peak_rss_mib"`
	GeneratorCores            float64 `json:"generator_cores"`
	// Seconds the threads of the leader (of this process) spent runnable but waiting for
	// a CPU, per interval (/proc/PID/task/*/schedstat): the machine's contention.
	LeaderWaitPerInterval    float64 `json:"leader_run_queue_wait_s_per_interval"`
	GeneratorWaitPerInterval float64 `json:"generator_run_queue_wait_s_per_interval"`

	P50ms           float64 `json:"report_p50_ms"`
	P99ms           float64 `json:"report_p99_ms"`
	MaxMs           float64 `json:"report_max_ms"`
	Failed          int64   `json:"report_attempts_failed"`
	Dropped         int64   `json:"reports_dropped"`
	RefusedByLeader int64   `json:"reports_not_accepted_by_leader"` // allot_balancer_reports_total other than accepted
	WarmFailed      int64   `json:"warm_report_attempts_failed"`
	WarmDropped     int64   `json:"warm_reports_dropped"`

	Recomputes      int     `json:"recomputes"`
	RecomputeMeanMs float64 `json:"recompute_mean_ms"`
	RecomputeMaxMs  float64 `json:"recompute_max_ms_bound"` // the bucket bound of the slowest; -1: over the last bucket

	VersionsPerInterval   float64 `json:"versions_per_interval"`
	EtcdKBPerInterval     float64 `json:"etcd_kb_per_interval"`
	EtcdWritesPerInterval float64 `json:"etcd_writes_per_interval"`
	EtcdCPUPerInterval    float64 `json:"etcd_cpu_s_per_interval"`
	EtcdDBMiB             float64 `json:"etcd_db_mib"`

	ProbeSettled       bool    `json:"probe_settled"` // us-east held ≥ 0.9 of the probe when it moved
	ProbeFirstVersionS float64 `json:"probe_first_version_s"`
	ProbeMoveS         float64 `json:"probe_move_s"`

	StealPct float64 `json:"steal_pct"`
	LoadAvg  string  `json:"load_avg"`
}

// failed says why the step fails the sequence's test ("" when it holds): report p99 over
// 1 s, or any report attempt failed in the window.
func (r *scaleRow) failed() string {
	switch {
	case r.Skipped != "":
		return ""
	case r.Reports == 0:
		return "no report accepted"
	case r.P99ms > 1000:
		return fmt.Sprintf("report p99 %.0f ms > 1 s", r.P99ms)
	case r.Failed > 0:
		return fmt.Sprintf("%d report attempts failed", r.Failed)
	}
	return ""
}

func (r *scaleRow) step() string {
	s := fmt.Sprintf("%d×%d", r.Enforcers, r.IdentitiesPerReport)
	if r.Population > 0 {
		s += fmt.Sprintf("/%d", r.Population)
	}
	return s
}

func (r *scaleRow) String() string {
	if r.Skipped != "" {
		return fmt.Sprintf("%s %s: skipped (%s)", r.Sequence, r.step(), r.Skipped)
	}
	return fmt.Sprintf("%s %s: %.0f identity-reports/interval, %d tracked; leader %.2f CPU s/interval (%.2f µs/identity-report), RSS %.0f MiB; report p50 %.0f p99 %.0f max %.0f ms, %d failed, %d dropped (warm-up %d, %d); recompute %d × %.0f ms; %.2f versions, %.0f KB to etcd per interval; probe %.2f s / %.2f s; generator %.2f cores",
		r.Sequence, r.step(), r.IdentityReportsPerInterval, r.Tracked, r.LeaderCPUPerInterval, r.LeaderUsPerIdentityReport, r.LeaderRSSMiB,
		r.P50ms, r.P99ms, r.MaxMs, r.Failed, r.Dropped, r.WarmFailed, r.WarmDropped, r.Recomputes, r.RecomputeMeanMs,
		r.VersionsPerInterval, r.EtcdKBPerInterval, r.ProbeFirstVersionS, r.ProbeMoveS, r.GeneratorCores)
}

// scaleReport is what `make bench-scale` writes to bin/bench-scale.json.
type scaleReport struct {
	Commit           string         `json:"commit"`
	Balancer         string         `json:"balancer"`
	Cores            int            `json:"cores"`
	GOMAXPROCS       int            `json:"gomaxprocs"`
	Started          string         `json:"started"`
	WallS            float64        `json:"wall_s"`
	LoadAvgBefore    string         `json:"load_avg_before"`
	LoadAvgAfter     string         `json:"load_avg_after"`
	IntervalS        float64        `json:"interval_s"`
	WarmIntervals    int            `json:"warm_intervals"`
	MeasureIntervals int            `json:"measure_intervals"`
	RatePerEnforcer  float64        `json:"requests_per_s_per_enforcer"`
	Rows             []*scaleRow    `json:"steps"`
	Apply            []*applyResult `json:"apply"`
	Extrapolation    *scaleFit      `json:"extrapolation"`
}

func (r *scaleReport) write(path string) error {
	raw, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(raw, '\n'), 0o644)
}

// ran is the rows of the steps that ran.
func (r *scaleReport) ran() []*scaleRow {
	var out []*scaleRow
	for _, row := range r.Rows {
		if row.Skipped == "" {
			out = append(out, row)
		}
	}
	return out
}

// largestHeld is the step with the most identity-reports per interval among those that
// held (report p99 ≤ 1 s, no attempt failed); nil if none did.
func (r *scaleReport) largestHeld() *scaleRow {
	var best *scaleRow
	for _, row := range r.ran() {
		if row.failed() == "" && (best == nil || row.IdentityReportsPerInterval > best.IdentityReportsPerInterval) {
			best = row
		}
	}
	return best
}

type scaleFigure struct {
	name string
	cell func(*scaleRow) string
}

func f0(v float64) string { return fmt.Sprintf("%.0f", v) }
func f2(v float64) string { return fmt.Sprintf("%.2f", v) }

// secs prints a probe time; -1 is "not seen".
func secs(v float64) string {
	if v < 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f", v)
}

var scaleFigures = []scaleFigure{
	{"sequence", func(r *scaleRow) string { return r.Sequence }},
	{"identity-reports / interval", func(r *scaleRow) string { return f0(r.IdentityReportsPerInterval) }},
	{"identities tracked (listed in the share set)", func(r *scaleRow) string { return fmt.Sprintf("%d (%d)", r.Tracked, r.Listed) }},
	{"reports / enforcer-interval (early reports / interval)", func(r *scaleRow) string {
		return fmt.Sprintf("%.2f (%.0f)", r.ReportsPerEnforcerInterval, r.EarlyPerInterval)
	}},
	{"leader CPU s / interval (cores)", func(r *scaleRow) string { return fmt.Sprintf("%.2f (%.2f)", r.LeaderCPUPerInterval, r.LeaderCores) }},
	{"leader µs / identity-report", func(r *scaleRow) string { return f2(r.LeaderUsPerIdentityReport) }},
	{"leader RSS MiB (peak)", func(r *scaleRow) string { return fmt.Sprintf("%.0f (%.0f)", r.LeaderRSSMiB, r.LeaderPeakRSSMiB) }},
	{"report RPC p50 / p99 / max ms", func(r *scaleRow) string { return fmt.Sprintf("%.0f / %.0f / %.0f", r.P50ms, r.P99ms, r.MaxMs) }},
	{"report attempts failed, dropped (warm-up)", func(r *scaleRow) string {
		return fmt.Sprintf("%d, %d (%d, %d)", r.Failed, r.Dropped, r.WarmFailed, r.WarmDropped)
	}},
	{"recomputes, mean ms, slowest ≤ ms", func(r *scaleRow) string {
		slowest := f0(r.RecomputeMaxMs)
		if r.RecomputeMaxMs < 0 {
			slowest = "> 23842"
		}
		return fmt.Sprintf("%d, %.0f, %s", r.Recomputes, r.RecomputeMeanMs, slowest)
	}},
	{"versions / interval", func(r *scaleRow) string { return f2(r.VersionsPerInterval) }},
	{"etcd KB written / interval (transactions)", func(r *scaleRow) string {
		return fmt.Sprintf("%.0f (%.1f)", r.EtcdKBPerInterval, r.EtcdWritesPerInterval)
	}},
	{"etcd CPU s / interval (db MiB)", func(r *scaleRow) string { return fmt.Sprintf("%.2f (%.0f)", r.EtcdCPUPerInterval, r.EtcdDBMiB) }},
	{"report → share s: first version / move done", func(r *scaleRow) string {
		s := secs(r.ProbeFirstVersionS) + " / " + secs(r.ProbeMoveS)
		if !r.ProbeSettled {
			s += " (probe not settled)"
		}
		return s
	}},
	{"leader threads waiting for a CPU s / interval", func(r *scaleRow) string { return f2(r.LeaderWaitPerInterval) }},
	{"generator cores (waiting s / interval), steal %", func(r *scaleRow) string {
		return fmt.Sprintf("%.2f (%.2f), %.1f", r.GeneratorCores, r.GeneratorWaitPerInterval, r.StealPct)
	}},
	{"held (p99 ≤ 1 s, no attempt failed)", func(r *scaleRow) string {
		if why := r.failed(); why != "" {
			return "no: " + why
		}
		return "yes"
	}},
}

// table is the one table `make bench-scale` prints: a column per step that ran, a row per
// figure; then the enforcer's apply path and the extrapolation.
func (r *scaleReport) table() string {
	var sb strings.Builder
	rows := r.ran()
	fmt.Fprintf(&sb, "\nscale benchmark: commit %s, balancer %s, %d cores (GOMAXPROCS %d), interval %gs, %d intervals warm + %d measured a step, %.0f requests/s per enforcer, %.0f s in all; load average %s before, %s after\n\n",
		r.Commit, r.Balancer, r.Cores, r.GOMAXPROCS, r.IntervalS, r.WarmIntervals, r.MeasureIntervals, r.RatePerEnforcer, r.WallS, r.LoadAvgBefore, r.LoadAvgAfter)
	sb.WriteString("| enforcers × identities per report |")
	for _, row := range rows {
		sb.WriteString(" " + row.step() + " |")
	}
	sb.WriteString("\n|---|" + strings.Repeat("---|", len(rows)) + "\n")
	for _, f := range scaleFigures {
		sb.WriteString("| " + f.name + " |")
		for _, row := range rows {
			sb.WriteString(" " + f.cell(row) + " |")
		}
		sb.WriteString("\n")
	}
	for _, row := range r.Rows {
		if row.Skipped != "" {
			fmt.Fprintf(&sb, "\nnot run: %s %s (%s)", row.Sequence, row.step(), row.Skipped)
		}
	}
	if len(r.Apply) > 0 {
		sb.WriteString("\n\n| enforcer apply path: share set of | chunks | MB in etcd | decode + apply, whole set: ms (CPU ms) | new version, one chunk changed: ms (CPU ms) | heap MiB: mirror + table (table alone) |\n|---|---|---|---|---|---|\n")
		for _, a := range r.Apply {
			fmt.Fprintf(&sb, "| %d entries | %d | %.1f | %.0f (%.0f) | %.0f (%.0f) | %.0f (%.0f) |\n",
				a.Entries, a.Chunks, a.Bytes/1e6, a.FullMs, a.FullCPUMs, a.VersionMs, a.VersionCPUMs, a.HeapMiB, a.TableMiB)
		}
	}
	if e := r.Extrapolation; e != nil {
		sb.WriteString("\n" + e.String())
	}
	return sb.String()
}
