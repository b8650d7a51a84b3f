package sim

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// ErrNoDetail: the run kept no per-second detail (Options.SummaryOnly).
var ErrNoDetail = errors.New("sim: the run kept no per-second detail (Options.SummaryOnly): no CSV or plots")

// WriteJSON writes the summary as indented JSON, exactly the fields of Summary.
func (res *Result) WriteJSON(w io.Writer) error {
	b, err := json.MarshalIndent(res.Summary, "", "  ")
	if err != nil {
		return fmt.Errorf("sim: while encoding the summary: %w", err)
	}
	b = append(b, '\n')
	_, err = w.Write(b)
	return err
}

// WriteTable writes the human-readable table: per key the offered and admitted totals,
// the three figures against their expectations, and pass/fail; then the failures.
func (res *Result) WriteTable(w io.Writer) error {
	sc := res.Scenario
	verdict := "PASS"
	if !res.Summary.Pass {
		verdict = "FAIL"
	}
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "scenario %s  policy %s  %ds  %d regions  %d keys  %s\n\n",
		sc.Name, res.Policy, res.Seconds, len(sc.Regions), len(sc.Keys), verdict)
	rows := make([]int, len(res.Verdicts))
	for i := range rows {
		rows[i] = i
	}
	if len(rows) > TableKeys {
		// A population: the distribution of each figure over every key, how many keys fail
		// each, and the worst keys (failing first, then by how far) instead of every row.
		res.writeDistribution(bw)
		rows = res.worst(TableKeys)
		fmt.Fprintf(bw, "the %d worst of %d keys:\n", len(rows), len(res.Verdicts))
	}
	tw := tabwriter.NewWriter(bw, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "key\toffered\tadmitted\tlimit/s\tmax_window_ratio 10s\t60s\t300s\t(≤ %g)\tsteady_ratio\t(≥ %g)\trecovery_s max\t(≤ %g)\tcalls/req\t\n",
		sc.Expect.MaxWindowRatio, sc.Expect.SteadyRatio, sc.Expect.RecoveryS)
	mark := func(ok bool) string {
		if ok {
			return "ok"
		}
		return "FAIL"
	}
	for _, i := range rows {
		v := res.Verdicts[i]
		rec := maxRecovery(v)
		calls := "—" // live: the enforcers' store calls are not seen (their metrics are)
		if res.StoreCallsSeen {
			calls = fmt.Sprintf("%.4f", v.StoreCallsPerRequest)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%g\t%.4f\t%.4f\t%.4f\t%s\t%.4f\t%s\t%g\t%s\t%s\t\n",
			v.Key, v.Offered, v.Admitted, res.Summary.Keys[i].Rate,
			v.MaxWindowRatio, v.MaxWindowRatio60s, v.MaxWindowRatio300s, mark(!v.WindowFailed),
			v.SteadyRatio, mark(!v.SteadyFailed),
			rec, mark(!v.RecoveryFailed),
			calls)
	}
	tw.Flush()
	if cp := res.Summary.ControlPlane; cp != nil {
		fmt.Fprintf(bw, "\ncontrol plane: %d versions (%.2f per interval; %.2f over %d steady seconds), %d bytes written to etcd (%.0f per interval), %d recomputes\n",
			cp.Versions, cp.VersionsPerInterval, cp.SteadyVersionsPerInterval, cp.SteadySeconds, cp.BytesWritten, cp.BytesPerInterval, cp.Recomputes)
		if cp.AnswersLost > 0 {
			fmt.Fprintf(bw, "answers lost: %d (reports taken whose answer a fault dropped)\n", cp.AnswersLost)
		}
	}
	if len(res.Summary.Failures) > 0 {
		fmt.Fprintln(bw, "\nfailures:")
		for j, f := range res.Summary.Failures {
			if j == TableKeys && len(res.Summary.Failures) > TableKeys+1 {
				fmt.Fprintf(bw, "  ... and %d more (-json or -summary has them all)\n", len(res.Summary.Failures)-j)
				break
			}
			fmt.Fprintln(bw, "  "+f)
		}
	}
	return bw.Flush()
}

// TableKeys is how many keys (and failures) the table lists; a scenario with more keys
// gets the distribution of each figure and its worst keys instead.
const TableKeys = 25

func maxRecovery(v Verdict) float64 {
	rec := 0.0
	for _, x := range v.RecoveryS {
		rec = max(rec, x)
	}
	return rec
}

// writeDistribution writes, per figure, how many keys fail it and its quantiles over all
// keys.
func (res *Result) writeDistribution(w io.Writer) {
	n := len(res.Verdicts)
	win, win60, steady, rec := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
	split := make([]float64, n)
	var fw, fs, fr, fsplit int
	for i, v := range res.Verdicts {
		win[i], win60[i], steady[i], rec[i] = v.MaxWindowRatio, v.MaxWindowRatio60s, v.SteadyRatio, maxRecovery(v)
		split[i] = v.SteadySplit
		fw += b2i(v.WindowFailed)
		fs += b2i(v.SteadyFailed)
		fr += b2i(v.RecoveryFailed)
		fsplit += b2i(v.SteadyFailed && v.SteadySplit < res.Scenario.Expect.SteadyRatio)
	}
	sc := res.Scenario.Expect
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "over %d keys\tfail\tmin\t1%%\t10%%\tmedian\t90%%\t99%%\tmax\t\n", n)
	for _, f := range []struct {
		name string
		fail int
		v    []float64
	}{
		{fmt.Sprintf("max_window_ratio 10s (≤ %g)", sc.MaxWindowRatio), fw, win},
		{"max_window_ratio 60s", -1, win60},
		{fmt.Sprintf("steady_ratio (≥ %g)", sc.SteadyRatio), fs, steady},
		{"steady_split (reference)", -1, split},
		{fmt.Sprintf("recovery_s max (≤ %g)", sc.RecoveryS), fr, rec},
	} {
		slices.Sort(f.v)
		q := func(p float64) float64 { return f.v[min(n-1, int(p*float64(n)))] }
		fail := "—"
		if f.fail >= 0 {
			fail = strconv.Itoa(f.fail)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.4g\t%.4g\t%.4g\t%.4g\t%.4g\t%.4g\t%.4g\t\n",
			f.name, fail, f.v[0], q(0.01), q(0.1), q(0.5), q(0.9), q(0.99), f.v[n-1])
	}
	tw.Flush()
	if fs > 0 {
		fmt.Fprintf(w, "\nsteady_ratio fails %d keys; %d of them fail it under the split reference too (their burst cut\n"+
			"between the regions in proportion to their traffic refuses that much of the same arrivals)\n", fs, fsplit)
	}
	fmt.Fprintln(w)
}

// worst returns the indexes of the k worst keys: those failing most figures first, then
// the lowest steady_ratio, the highest max_window_ratio and the longest recovery.
func (res *Result) worst(k int) []int {
	idx := make([]int, len(res.Verdicts))
	for i := range idx {
		idx[i] = i
	}
	v := res.Verdicts
	slices.SortStableFunc(idx, func(a, b int) int {
		fa := b2i(v[a].WindowFailed) + b2i(v[a].SteadyFailed) + b2i(v[a].RecoveryFailed)
		fb := b2i(v[b].WindowFailed) + b2i(v[b].SteadyFailed) + b2i(v[b].RecoveryFailed)
		return cmp.Or(cmp.Compare(fb, fa), cmp.Compare(v[a].SteadyRatio, v[b].SteadyRatio),
			cmp.Compare(v[b].MaxWindowRatio, v[a].MaxWindowRatio), cmp.Compare(maxRecovery(v[b]), maxRecovery(v[a])))
	})
	return idx[:min(k, len(idx))]
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// CSVHeader is the header of the per-second CSV.
var CSVHeader = "t,key,region,offered,admitted,share,regional_rate," + strings.Join(SourceColumns[:], ",")

// WriteCSV writes one row per second, key and region: t (the second's start, in seconds),
// the key, the region, requests offered and admitted, the share in force at the second's
// end and the regional rate it gives (per second), and the answers by source.
func (res *Result) WriteCSV(w io.Writer) error {
	if res.Keys == nil && len(res.Scenario.Keys) > 0 {
		return ErrNoDetail
	}
	bw := bufio.NewWriter(w)
	bw.WriteString(CSVHeader)
	bw.WriteByte('\n')
	var line []byte
	for k, key := range res.Scenario.Keys {
		for s := 0; s < res.Seconds; s++ {
			for r, reg := range res.Scenario.Regions {
				c := res.Cell(k, s, r)
				line = strconv.AppendInt(line[:0], int64(s), 10)
				line = append(line, ',')
				line = append(line, key.Name...)
				line = append(line, ',')
				line = append(line, reg.Name...)
				line = append(line, ',')
				line = strconv.AppendInt(line, c.Offered, 10)
				line = append(line, ',')
				line = strconv.AppendInt(line, c.Admitted, 10)
				line = append(line, ',')
				line = strconv.AppendFloat(line, c.Share, 'g', 6, 64)
				line = append(line, ',')
				line = strconv.AppendFloat(line, c.RegionalRate, 'g', 6, 64)
				for _, n := range c.Sources {
					line = append(line, ',')
					line = strconv.AppendInt(line, n, 10)
				}
				line = append(line, '\n')
				bw.Write(line)
			}
		}
	}
	return bw.Flush()
}
