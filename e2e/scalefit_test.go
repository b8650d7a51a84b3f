package e2e

import (
	"fmt"
	"math"
	"strings"
)

// The extrapolation of BenchmarkBalancerScale to the design's fan-in (docs/design.md §12:
// about 1,000 enforcers × up to 10,000 identities every 10 s), fitted to the steps that
// ran. Each fit is stated with its form, so a reader can redo it from the JSON.

// Design fan-in: identity-reports per 10 s interval, and the interval.
const (
	designIdentityReports = 10_000_000
	designIntervalS       = 10.0
)

// designTracked are the identities a leader may track at the design's fan-in: a million
// (each key reported by ten enforcers), and the balancer's own cap (max_identities).
var designTracked = []int{1_000_000, 2_000_000}

// scaleFit is the extrapolation.
type scaleFit struct {
	Steps int `json:"steps_fitted"`
	// Leader CPU per interval ≈ CPUPerReportUs × identity-reports + CPUPerTrackedUs ×
	// identities tracked (least squares over the steps, through the origin).
	CPUPerReportUs  float64 `json:"cpu_us_per_identity_report"`
	CPUPerTrackedUs float64 `json:"cpu_us_per_identity_tracked"`
	// Mean recompute ≈ RecomputeMsPer100k × tracked / 100,000 (through the origin).
	RecomputeMsPer100k float64 `json:"recompute_ms_per_100k_tracked"`
	// Leader RSS ≈ RSSBaseMiB + RSSMiBPer100k × tracked / 100,000.
	RSSBaseMiB    float64 `json:"rss_base_mib"`
	RSSMiBPer100k float64 `json:"rss_mib_per_100k_tracked"`
	// TrackedAtOneSecond is where the mean recompute reaches 1 s: the core holds its lock
	// for the whole recompute, so from there on the reports that arrive during one (10% of
	// them at a 10 s interval) wait longer than the p99 bound.
	TrackedAtOneSecond float64 `json:"tracked_at_1s_recompute"`
	// HeldIdentityReports is the largest fan-in held (identity-reports per interval), and
	// HeldStep its step.
	HeldIdentityReports float64        `json:"held_identity_reports_per_interval"`
	HeldStep            string         `json:"held_step"`
	Design              []designFigure `json:"design"`
}

// designFigure is the leader at the design's fan-in with Tracked identities tracked.
type designFigure struct {
	Tracked    int     `json:"tracked"`
	Cores      float64 `json:"leader_cores_at_10s"` // CPU per 10 s interval / 10 s
	RecomputeS float64 `json:"recompute_s"`
	RSSGiB     float64 `json:"rss_gib"`
}

// extrapolate fits the steps that ran with reports (nil when none did).
func (r *scaleReport) extrapolate() *scaleFit {
	var rows []*scaleRow
	for _, row := range r.ran() {
		if row.Reports > 0 && row.IdentityReportsPerInterval > 0 {
			rows = append(rows, row)
		}
	}
	if len(rows) == 0 {
		return nil
	}
	f := &scaleFit{Steps: len(rows)}
	// CPU: two variables, no intercept. Normal equations of y = a·x1 + c·x2.
	var s11, s12, s22, s1y, s2y float64
	for _, row := range rows {
		x1, x2, y := row.IdentityReportsPerInterval, float64(row.Tracked), row.LeaderCPUPerInterval*1e6
		s11, s12, s22, s1y, s2y = s11+x1*x1, s12+x1*x2, s22+x2*x2, s1y+x1*y, s2y+x2*y
	}
	det := s11*s22 - s12*s12
	if det > 1e-9*s11*s22 {
		f.CPUPerReportUs, f.CPUPerTrackedUs = (s1y*s22-s2y*s12)/det, (s2y*s11-s1y*s12)/det
	}
	if !(f.CPUPerReportUs > 0) || f.CPUPerTrackedUs < 0 { // collinear, or noise: one variable
		f.CPUPerReportUs, f.CPUPerTrackedUs = s1y/s11, 0
	}
	var tt, tm float64
	for _, row := range rows {
		if row.Recomputes > 0 {
			t := float64(row.Tracked)
			tt, tm = tt+t*t, tm+t*row.RecomputeMeanMs
		}
	}
	if tt > 0 {
		f.RecomputeMsPer100k = tm / tt * 1e5
		if f.RecomputeMsPer100k > 0 {
			f.TrackedAtOneSecond = 1000 / f.RecomputeMsPer100k * 1e5
		}
	}
	// RSS: ordinary least squares with an intercept.
	var n, sx, sy, sxx, sxy float64
	for _, row := range rows {
		x, y := float64(row.Tracked), row.LeaderRSSMiB
		n, sx, sy, sxx, sxy = n+1, sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	if d := n*sxx - sx*sx; d > 0 {
		slope := (n*sxy - sx*sy) / d
		f.RSSBaseMiB, f.RSSMiBPer100k = (sy-slope*sx)/n, slope*1e5
	} else {
		f.RSSBaseMiB = sy / n
	}
	if held := r.largestHeld(); held != nil {
		f.HeldIdentityReports, f.HeldStep = held.IdentityReportsPerInterval, held.Sequence+" "+held.step()
	}
	for _, t := range designTracked {
		x := float64(t)
		f.Design = append(f.Design, designFigure{Tracked: t,
			Cores:      (f.CPUPerReportUs*designIdentityReports + f.CPUPerTrackedUs*x) / 1e6 / designIntervalS,
			RecomputeS: f.RecomputeMsPer100k * x / 1e5 / 1000,
			RSSGiB:     (f.RSSBaseMiB + f.RSSMiBPer100k*x/1e5) / 1024})
	}
	return f
}

func (f *scaleFit) String() string {
	var sb strings.Builder
	held := "none: no step held"
	if f.HeldStep != "" {
		held = fmt.Sprintf("%.0f identity-reports per interval (%s)", f.HeldIdentityReports, f.HeldStep)
	}
	fmt.Fprintf(&sb, "largest fan-in one leader held (report p99 ≤ 1 s, no attempt failed): %s\n", held)
	fmt.Fprintf(&sb, "fits over %d steps: leader CPU per interval ≈ %.2f µs × identity-reports + %.2f µs × identities tracked; "+
		"recompute ≈ %.0f ms per 100,000 identities tracked (1 s at %s tracked); RSS ≈ %.0f MiB + %.0f MiB per 100,000 tracked\n",
		f.Steps, f.CPUPerReportUs, f.CPUPerTrackedUs, f.RecomputeMsPer100k, thousands(f.TrackedAtOneSecond), f.RSSBaseMiB, f.RSSMiBPer100k)
	for _, d := range f.Design {
		fmt.Fprintf(&sb, "at the design's fan-in (%s identity-reports per %.0f s), %s identities tracked: leader %.2f cores, recompute %.1f s (the core's lock), RSS %.1f GiB\n",
			thousands(designIdentityReports), designIntervalS, thousands(float64(d.Tracked)), d.Cores, d.RecomputeS, d.RSSGiB)
	}
	return sb.String()
}

// thousands prints v rounded, with commas.
func thousands(v float64) string {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return fmt.Sprint(v)
	}
	s := fmt.Sprintf("%.0f", v)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}
