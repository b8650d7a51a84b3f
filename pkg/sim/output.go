package sim

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	tw := tabwriter.NewWriter(bw, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "key\toffered\tadmitted\tlimit/s\tmax_window_ratio 10s\t60s\t300s\t(≤ %g)\tsteady_ratio\t(≥ %g)\trecovery_s max\t(≤ %g)\tcalls/req\t\n",
		sc.Expect.MaxWindowRatio, sc.Expect.SteadyRatio, sc.Expect.RecoveryS)
	mark := func(ok bool) string {
		if ok {
			return "ok"
		}
		return "FAIL"
	}
	for i, v := range res.Verdicts {
		rec := 0.0
		for _, x := range v.RecoveryS {
			rec = max(rec, x)
		}
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
	}
	if len(res.Summary.Failures) > 0 {
		fmt.Fprintln(bw, "\nfailures:")
		for _, f := range res.Summary.Failures {
			fmt.Fprintln(bw, "  "+f)
		}
	}
	return bw.Flush()
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
