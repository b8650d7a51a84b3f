package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/allot-dev/allot/pkg/balancer/admin"
	"github.com/allot-dev/allot/pkg/rules"
)

// The rules commands: list what etcd holds, apply a rule file, delete one rule, and check
// a file here, as an enforcer would (rules check: no balancer, nothing written).

// rulesList is `rules list`.
func rulesList(*flag.FlagSet) runFunc {
	return func(ctx context.Context, cl *admin.Client, _ []string, env cliEnv) (any, error) {
		r, err := cl.Rules(ctx)
		if err == nil {
			printRules(env.stdout, r, time.Now())
		}
		return nil, err
	}
}

// rulesApply is `rules apply -f FILE -reason WHY [-revision N] [-dry-run]`.
func rulesApply(fs *flag.FlagSet) runFunc {
	file := fs.String("f", "", "rule file (YAML)")
	reason, revision := changeFlags(fs)
	dryRun := dryRunFlag(fs)
	return func(ctx context.Context, cl *admin.Client, _ []string, env cliEnv) (any, error) {
		if *file == "" {
			fmt.Fprintln(env.stderr, "balancer rules apply: -f FILE is required")
			return nil, exit(2)
		}
		data, err := os.ReadFile(*file)
		if err != nil {
			fmt.Fprintln(env.stderr, "balancer:", err)
			return nil, exit(1)
		}
		return cl.Apply(ctx, admin.ApplyRequest{Revision: *revision, Reason: *reason, File: *file, YAML: string(data), DryRun: *dryRun})
	}
}

// rulesCheck is `rules check -f FILE` (checkLocal).
func rulesCheck(fs *flag.FlagSet) runFunc {
	file := fs.String("f", "", "rule file (YAML)")
	return func(_ context.Context, _ *admin.Client, _ []string, env cliEnv) (any, error) {
		if code := checkLocal(*file, env); code != 0 {
			return nil, exit(code)
		}
		return nil, nil
	}
}

// rulesDelete is `rules delete ID -reason WHY [-revision N]`.
func rulesDelete(fs *flag.FlagSet) runFunc {
	reason, revision := changeFlags(fs)
	return func(ctx context.Context, cl *admin.Client, pos []string, env cliEnv) (any, error) {
		id, err := one("rules delete", pos, env)
		if err != nil {
			return nil, err
		}
		return cl.Delete(ctx, "rules", id, *reason, *revision)
	}
}

// checkLocal is `rules check -f FILE`: the enforcers' own check (rules.CheckFile), here,
// with no balancer: it writes nothing, so it needs neither the admin API nor a token.
func checkLocal(file string, env cliEnv) int {
	if file == "" {
		fmt.Fprintln(env.stderr, "balancer rules check: -f FILE is required")
		return 2
	}
	if err := rules.CheckFile(file); err != nil {
		fmt.Fprintln(env.stderr, strings.TrimSpace(err.Error()))
		return 1
	}
	set, err := rules.LoadFile(file)
	if err != nil {
		fmt.Fprintln(env.stderr, err)
		return 1
	}
	fmt.Fprintf(env.stdout, "%s: ok, %d rules\n", file, len(set.Rules))
	return 0
}

// printRules lists rules, one a line; STATE says "EXPIRED" for an override whose
// expires_at has passed at now (it no longer applies anywhere) and "error" for a value that
// does not parse (refused by every enforcer).
func printRules(w io.Writer, r admin.RulesResponse, now time.Time) {
	fmt.Fprintf(w, "revision %d, %d rules\n", r.Revision, len(r.Rules))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKEY\tMOD_REVISION\tSTATE\tRULE")
	for _, e := range r.Rules {
		body, state := e.Error, "error"
		if body == "" {
			var v any
			_ = json.Unmarshal(e.Rule, &v)
			b, _ := json.Marshal(v) // one line
			body, state = string(b), ""
			var exp struct {
				ExpiresAt time.Time `json:"expires_at"`
			}
			if json.Unmarshal(e.Rule, &exp) == nil && !exp.ExpiresAt.IsZero() && !exp.ExpiresAt.After(now) {
				state = "EXPIRED"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", e.ID, e.Key, e.ModRevision, state, body)
	}
	tw.Flush()
}
