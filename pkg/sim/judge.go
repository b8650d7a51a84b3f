package sim

import (
	"fmt"
	"math"
	"strings"
)

// The judge turns one key's per-second series into the figures a scenario is judged by.
// Every figure is computed from whole seconds of the run (t = 0 is the first second).
//
// max_window_ratio — is the global limit held? For every window of W = 10 consecutive
// seconds, the requests admitted in all regions together, divided by what one bucket of
// the key's limit could admit in W:
//
//	ratio(t) = Σ_{s=t}^{t+W-1} admitted(s) / (rate × W + burst)
//
// and the figure is the largest ratio(t). A token bucket (rate per second, capacity
// burst) admits at most rate × W + burst in any window of length W, so a ratio above 1 is
// over-admission that no single bucket would have allowed. A run shorter than W has one
// window, the whole run, with W its length.
//
// max_window_ratio_60s and max_window_ratio_300s are the same figure over windows of
// W = 60 s and W = 300 s (LongRatioWindows), judged against the same expectation. A
// 10 s window hides a small limit's excess behind its burst (a 1-a-minute key allows
// 10/60 + burst in 10 s, so three regions each admitting their one token read 3/1.17
// there but show the rate they keep up over longer windows); the longer windows show a
// per-minute key's rate held or not.
//
// steady_split — the same figure for the split reference (splitBucket): the key's bucket
// cut between the regions in proportion to what each is offered, fed the same arrivals.
// Not judged: it says how much of a low steady_ratio is the split itself (a burst of a few
// tokens cut three ways refuses Poisson bursts whatever the shares) and how much is where
// the shares are. 1 in live mode (not measured).
//
// steady_ratio — is the limit used when traffic is steady? Over the steady seconds, those
// at least Settle = 30 s after the start, after any of the key's phase changes and after
// any fault's start or end,
//
//	steady_ratio = Σ admitted(s) / Σ min(offered(s), rate)
//
// i.e. the admitted part of what one bucket would have admitted of the offered traffic,
// ignoring bursts (a single second can admit more than rate from the bucket's reserve;
// over a steady stretch it cannot). With no steady second, or nothing offered in them,
// the figure is 1 (nothing to lose).
//
// recovery_s — how long after traffic changes is the key held under its limit? For each
// phase (its start is a change, the first phase's included), the seconds from the phase's
// start — or from the end of a fault within the phase, when one ended later — to the start
// of the first 5 s window, inside the phase and overlapping no fault, whose admitted total
// reaches 0.95 × Σ min(offered(s), rate) over the window. A phase
// with no such window never recovered: it reports its remaining length and fails. A phase
// every window of which overlaps a fault is not judged: it reports its length and does
// not fail (the fault's own figures say what happened). A phase shorter than 5 s is
// judged on one window of its whole length.

// Judge windows (seconds).
const (
	RatioWindow    = 10
	RatioWindow60  = 60
	RatioWindow300 = 300
	Settle         = 30
	RecoveryWindow = 5
	RecoveryLevel  = 0.95
)

// Span is a half-open interval of whole seconds [From, To) of a run.
type Span struct{ From, To int }

// Expect are the figures a key must meet (scenario.Expect, as plain numbers).
type Expect struct {
	MaxWindowRatio float64
	SteadyRatio    float64
	RecoveryS      float64
}

// KeySeries is what the judge reads of one key: global per-second totals over the run.
type KeySeries struct {
	Key   string
	Rate  float64 // tokens per second
	Burst float64
	// Offered and Admitted are the requests in each second, summed over regions; Split,
	// when not nil, what the split reference admitted of them (splitBucket).
	Offered, Admitted, Split []float64
	// Phases are the seconds at which the key's phases start, increasing.
	Phases []int
	// Requests is every request offered; StoreCalls is every call that reached a region's
	// bucket store (standing for Redis) for this key.
	Requests, StoreCalls int64
}

// KeyResult is one key's figures: the "keys" entries of the summary, field for field.
type KeyResult struct {
	Key                  string    `json:"key"`
	Rate                 float64   `json:"rate"`
	Burst                float64   `json:"burst"`
	Offered              int64     `json:"offered"`
	Admitted             int64     `json:"admitted"`
	MaxWindowRatio       float64   `json:"max_window_ratio"`
	MaxWindowRatio60s    float64   `json:"max_window_ratio_60s"`
	MaxWindowRatio300s   float64   `json:"max_window_ratio_300s"`
	SteadyRatio          float64   `json:"steady_ratio"`
	SteadySplit          float64   `json:"steady_split"`
	RecoveryS            []float64 `json:"recovery_s"`
	StoreCallsPerRequest float64   `json:"store_calls_per_request"`
}

// Verdict is a key's figures and what they fail.
type Verdict struct {
	KeyResult
	// MaxWindowAt is the first second of the 10 s window with the largest ratio;
	// MaxWindowAt60s and MaxWindowAt300s the same for the longer windows.
	MaxWindowAt, MaxWindowAt60s, MaxWindowAt300s int
	// SteadySeconds counts the seconds steady_ratio is computed over.
	SteadySeconds int
	// Failures say which figure missed, by how much and when; empty when the key passes.
	Failures []string
	// WindowFailed, SteadyFailed and RecoveryFailed say which figures missed.
	WindowFailed, SteadyFailed, RecoveryFailed bool
}

// Judge computes k's figures over a run with the given fault spans and compares them to
// exp. It does not change k.
func Judge(k *KeySeries, faults []Span, exp Expect) Verdict {
	n := len(k.Admitted)
	v := Verdict{KeyResult: KeyResult{Key: k.Key, Rate: k.Rate, Burst: k.Burst, RecoveryS: []float64{}}}
	for s := 0; s < n; s++ {
		v.Offered += int64(k.Offered[s])
		v.Admitted += int64(k.Admitted[s])
	}
	if k.Requests > 0 {
		v.StoreCallsPerRequest = float64(k.StoreCalls) / float64(k.Requests)
	}
	if n == 0 {
		v.SteadyRatio = 1
		return v
	}

	// max_window_ratio, over 10 s, 60 s and 300 s windows: one failure line naming the
	// first window length that fails and the figures of the others that fail too.
	var also []string
	fail := ""
	for _, win := range []struct {
		w   int
		dst *float64
		at  *int
	}{{RatioWindow, &v.MaxWindowRatio, &v.MaxWindowAt}, {RatioWindow60, &v.MaxWindowRatio60s, &v.MaxWindowAt60s},
		{RatioWindow300, &v.MaxWindowRatio300s, &v.MaxWindowAt300s}} {
		w := min(win.w, n)
		*win.dst, *win.at = maxWindow(k, w)
		if exp.MaxWindowRatio <= 0 || *win.dst <= exp.MaxWindowRatio {
			continue
		}
		v.WindowFailed = true
		name := "max_window_ratio"
		if win.w != RatioWindow {
			name = fmt.Sprintf("max_window_ratio_%ds", win.w)
		}
		if fail != "" {
			also = append(also, fmt.Sprintf("%s %.4f in %ds–%ds", name, *win.dst, *win.at, *win.at+w))
			continue
		}
		at := *win.at
		adm := 0.0
		for s := at; s < at+w; s++ {
			adm += k.Admitted[s]
		}
		fail = fmt.Sprintf(
			"key %s: %s %.4f above %.4g by %.1f%%: %.0f admitted in %ds–%ds, a bucket of %g/s burst %g allows %.0f",
			k.Key, name, *win.dst, exp.MaxWindowRatio, 100*(*win.dst/exp.MaxWindowRatio-1), adm, at, at+w, k.Rate, k.Burst, k.Rate*float64(w)+k.Burst)
	}
	if fail != "" {
		if len(also) > 0 {
			fail += " (also " + strings.Join(also, ", ") + ")"
		}
		v.Failures = append(v.Failures, fail)
	}

	// steady_ratio
	unsteady := make([]bool, n)
	mark := func(from int) {
		for s := max(from, 0); s < min(from+Settle, n); s++ {
			unsteady[s] = true
		}
	}
	mark(0)
	for _, p := range k.Phases {
		mark(p)
	}
	for _, f := range faults {
		mark(f.From)
		mark(f.To)
	}
	var adm, want, split float64
	first, last := -1, -1
	for s := 0; s < n; s++ {
		if unsteady[s] {
			continue
		}
		v.SteadySeconds++
		adm += k.Admitted[s]
		if k.Split != nil {
			split += k.Split[s]
		}
		want += math.Min(k.Offered[s], k.Rate)
		if first < 0 {
			first = s
		}
		last = s
	}
	v.SteadyRatio, v.SteadySplit = 1, 1
	if want > 0 {
		v.SteadyRatio = adm / want
		if k.Split != nil {
			v.SteadySplit = split / want
		}
	}
	if v.SteadyRatio < exp.SteadyRatio {
		v.SteadyFailed = true
		v.Failures = append(v.Failures, fmt.Sprintf(
			"key %s: steady_ratio %.4f below %.4g by %.1f%%: %.0f admitted of %.0f the limit would allow, over %d steady seconds in %ds–%ds",
			k.Key, v.SteadyRatio, exp.SteadyRatio, 100*(1-v.SteadyRatio/exp.SteadyRatio), adm, want, v.SteadySeconds, first, last+1))
	}

	// recovery_s
	for i, p := range k.Phases {
		if p >= n {
			break
		}
		end := n
		if i+1 < len(k.Phases) {
			end = min(k.Phases[i+1], n)
		}
		rec, judged, ok := recovery(k, p, end, faults)
		v.RecoveryS = append(v.RecoveryS, float64(rec))
		switch {
		case !judged:
		case !ok:
			v.RecoveryFailed = true
			v.Failures = append(v.Failures, fmt.Sprintf(
				"key %s: phase %d (from %ds) never recovered to %.0f%% of min(offered, limit) over %ds in its %ds",
				k.Key, i, p, 100*RecoveryLevel, min(RecoveryWindow, end-p), end-p))
		case exp.RecoveryS >= 0 && float64(rec) > exp.RecoveryS:
			v.RecoveryFailed = true
			v.Failures = append(v.Failures, fmt.Sprintf(
				"key %s: phase %d (from %ds) recovered after %ds, more than %gs by %gs",
				k.Key, i, p, rec, exp.RecoveryS, float64(rec)-exp.RecoveryS))
		}
	}
	return v
}

// maxWindow returns the largest ratio over the windows of w seconds (1 ≤ w ≤ the run's
// length) of the admitted total to rate × w + burst, and the first second of the first
// window that has it.
func maxWindow(k *KeySeries, w int) (ratio float64, at int) {
	allowed := k.Rate*float64(w) + k.Burst
	sum := 0.0
	for s := range k.Admitted {
		sum += k.Admitted[s]
		if s >= w {
			sum -= k.Admitted[s-w]
		}
		if s >= w-1 {
			if r := sum / allowed; r > ratio {
				ratio, at = r, s-w+1
			}
		}
	}
	return ratio, at
}

// recovery measures one phase [from, end): the offset of the first recovered window from
// the phase's start or from the end of the last fault inside the phase before it,
// whichever is later (time under a fault is the fault's: a move that must wait for a
// region cut off is held back by the fault, not by the balancer), and whether any window
// was eligible (judged) and whether one recovered (ok).
func recovery(k *KeySeries, from, end int, faults []Span) (rec int, judged, ok bool) {
	w := min(RecoveryWindow, end-from)
	for t := from; t+w <= end; t++ {
		if overlaps(Span{t, t + w}, faults) {
			continue
		}
		judged = true
		var adm, want float64
		for s := t; s < t+w; s++ {
			adm += k.Admitted[s]
			want += math.Min(k.Offered[s], k.Rate)
		}
		if adm >= RecoveryLevel*want {
			base := from
			for _, f := range faults {
				if f.From < t && f.To > from {
					base = max(base, min(f.To, t))
				}
			}
			return t - base, true, true
		}
	}
	return end - from, judged, false
}

func overlaps(a Span, spans []Span) bool {
	for _, b := range spans {
		if a.From < b.To && b.From < a.To {
			return true
		}
	}
	return false
}
