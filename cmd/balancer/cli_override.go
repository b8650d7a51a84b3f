package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/allot-dev/allot/pkg/balancer/admin"
)

// The override commands: list the per-key overrides, set one (the key's own limits until
// it expires, with a reason), delete one.

// overrideList is `override list`.
func overrideList(*flag.FlagSet) runFunc {
	return func(ctx context.Context, cl *admin.Client, _ []string, env cliEnv) (any, error) {
		r, err := cl.Overrides(ctx)
		if err == nil {
			printRules(env.stdout, r, time.Now())
		}
		return nil, err
	}
}

// overrideSet is `override set KEY -rate R -per 1s [-burst B] [-limit ...]... -expires T
// -reason WHY [-revision N] [-dry-run]`.
func overrideSet(fs *flag.FlagSet) runFunc {
	rate := fs.Float64("rate", 0, "tokens per -per")
	per := fs.String("per", "1s", "period of -rate")
	burst := fs.Float64("burst", 0, "bucket capacity (default the rate)")
	var limits limitsFlag
	fs.Var(&limits, "limit", "name=rate/per[/burst], repeatable")
	expires := fs.String("expires", "", "RFC 3339 time or a duration from now (72h)")
	reason, revision := changeFlags(fs)
	dryRun := dryRunFlag(fs)
	return func(ctx context.Context, cl *admin.Client, pos []string, env cliEnv) (any, error) {
		key, err := one("override set", pos, env)
		if err != nil {
			return nil, err
		}
		if *rate > 0 {
			limits = append(limitsFlag{{Name: "second", Rate: *rate, Per: *per, Burst: *burst}}, limits...)
		}
		exp := *expires
		if d, e := time.ParseDuration(exp); e == nil {
			exp = time.Now().Add(d).UTC().Format(time.RFC3339)
		}
		return cl.SetOverride(ctx, key, admin.OverrideRequest{Revision: *revision, Reason: *reason, ExpiresAt: exp, Limits: limits, DryRun: *dryRun})
	}
}

// overrideDelete is `override delete KEY -reason WHY [-revision N]`.
func overrideDelete(fs *flag.FlagSet) runFunc {
	reason, revision := changeFlags(fs)
	return func(ctx context.Context, cl *admin.Client, pos []string, env cliEnv) (any, error) {
		key, err := one("override delete", pos, env)
		if err != nil {
			return nil, err
		}
		return cl.Delete(ctx, "overrides", key, *reason, *revision)
	}
}

// limitsFlag collects -limit name=rate/per[/burst].
type limitsFlag []admin.LimitJSON

func (l *limitsFlag) String() string { return fmt.Sprint(*l) }
func (l *limitsFlag) Set(v string) error {
	name, spec, ok := strings.Cut(v, "=")
	parts := strings.Split(spec, "/")
	if !ok || len(parts) < 2 || len(parts) > 3 {
		return fmt.Errorf("%q: want name=rate/per[/burst], like second=500/1s/1000", v)
	}
	rate, err := strconv.ParseFloat(parts[0], 64)
	if err != nil {
		return fmt.Errorf("%q: rate %q is not a number", v, parts[0])
	}
	lim := admin.LimitJSON{Name: name, Rate: rate, Per: parts[1]}
	if len(parts) == 3 {
		if lim.Burst, err = strconv.ParseFloat(parts[2], 64); err != nil {
			return fmt.Errorf("%q: burst %q is not a number", v, parts[2])
		}
	}
	*l = append(*l, lim)
	return nil
}
