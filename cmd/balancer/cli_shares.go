package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/allot-dev/allot/pkg/balancer"
	"github.com/allot-dev/allot/pkg/balancer/admin"
)

// `shares KEY`: each region's share of the key's limits, from the leader's core or the
// published set, with the default split, the target and the demand.

// sharesCmd is `shares KEY`.
func sharesCmd(*flag.FlagSet) runFunc {
	return func(ctx context.Context, cl *admin.Client, pos []string, env cliEnv) (any, error) {
		key, err := one("shares", pos, env)
		if err != nil {
			return nil, err
		}
		r, err := cl.Shares(ctx, key)
		if err == nil {
			printShares(env.stdout, r)
		}
		return nil, err
	}
}

func printShares(w io.Writer, r admin.SharesResponse) {
	fmt.Fprintf(w, "%s (from the %s", r.Identity, r.Source)
	if r.Source == "etcd" {
		fmt.Fprintf(w, ": version %d of term %d, published %s", r.Version, r.LeaderRev, r.PublishedAt.Format(time.RFC3339))
	}
	fmt.Fprintln(w, ")")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "RULE\tREGION\tSHARE\tDEFAULT\tTARGET\tDEMAND/s\tREFUSED\n")
	for _, e := range r.Entries {
		for _, region := range r.Regions {
			note := ""
			if e.Default {
				note = " (default split)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%.3f%s\t%s\t%s\t%s\t%s\n", e.Rule, region, e.Shares[region], note, num(e.DefaultSplit, region), num(e.Target, region), num(e.Demand, region), percent(e.Refused, region))
		}
	}
	tw.Flush()
	for _, e := range r.Entries {
		if a := e.BurstAdvice; a != nil {
			fmt.Fprintf(w, "%s: the burst of %s (%g), cut between the regions, refuses over %.0f%% more of a region's demand under its rate than one bucket of the limit would; ",
				e.Rule, a.Limit, a.Now, 100*balancer.BurstShortAbove)
			if a.Burst > 0 {
				fmt.Fprintf(w, "a burst of %g would serve every region at these shares and demands\n", a.Burst)
			} else {
				fmt.Fprintf(w, "no burst up to %d times it would serve every region: the rate is short\n", balancer.MaxAdvisedFactor)
			}
		}
	}
}

// percent is m[k] as a percentage, or "-".
func percent(m map[string]float64, k string) string {
	if v, ok := m[k]; ok {
		return strconv.FormatFloat(100*v, 'f', 1, 64) + "%"
	}
	return "-"
}

func num(m map[string]float64, k string) string {
	if v, ok := m[k]; ok {
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
	return "-"
}
