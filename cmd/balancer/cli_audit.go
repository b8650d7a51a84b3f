package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/allot-dev/allot/pkg/balancer/admin"
)

// `audit [-n 20]`: the newest audit records, who changed what, when and why.

// auditCmd is `audit [-n 20]`.
func auditCmd(fs *flag.FlagSet) runFunc {
	n := fs.Int("n", 20, "records to show")
	return func(ctx context.Context, cl *admin.Client, _ []string, env cliEnv) (any, error) {
		r, err := cl.Audit(ctx, *n)
		if err != nil {
			return nil, err
		}
		tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "AT\tWHO\tACTION\tRULES\tREVISION\tREASON")
		for _, a := range r {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", a.At.Format(time.RFC3339), a.Who, a.Action, strings.Join(a.Rules, ","), a.Revision, a.Reason)
		}
		tw.Flush()
		return nil, nil
	}
}
