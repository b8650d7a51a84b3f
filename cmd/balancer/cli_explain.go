package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/allot-dev/allot/pkg/balancer/admin"
	"github.com/allot-dev/allot/pkg/enforcer"
)

// `explain KEY`: every registered enforcer's /v1/explain for a request with these
// attributes, side by side; an enforcer that did not answer makes it exit 1.

// explainCmd is `explain KEY [-plan P] [-org O] [-endpoint "GET /v1/x"] [-ip A]`.
func explainCmd(fs *flag.FlagSet) runFunc {
	plan := fs.String("plan", "", "the request's plan")
	org := fs.String("org", "", "the request's org")
	endpoint := fs.String("endpoint", "", `the request's endpoint ("GET /v1/search")`)
	ip := fs.String("ip", "", "the client address")
	return func(ctx context.Context, cl *admin.Client, pos []string, env cliEnv) (any, error) {
		key, err := one("explain", pos, env)
		if err != nil {
			return nil, err
		}
		q := url.Values{"api_key": {key}}
		for k, v := range map[string]string{"plan": *plan, "org": *org, "endpoint": *endpoint, "ip": *ip} {
			if v != "" {
				q.Set(k, v)
			}
		}
		r, err := cl.Explain(ctx, q)
		if err != nil {
			return nil, err
		}
		if failed := printExplain(env.stdout, r); failed > 0 {
			fmt.Fprintf(env.stderr, "balancer explain: %d of %d enforcers did not answer\n", failed, len(r.Enforcers))
			return nil, exit(1)
		}
		return nil, nil
	}
}

// printExplain prints the enforcers' answers side by side: a column per enforcer that
// answered, a block of rows per rule, each cell short (figures rounded, one fact a row) so
// six enforcers fit a terminal; then one line per enforcer that did not answer, with why.
// It returns how many did not answer (nothing answering, or any refusing, is a failure).
func printExplain(w io.Writer, r admin.ExplainResponse) (failed int) {
	if len(r.Enforcers) == 0 {
		fmt.Fprintf(w, "no enforcer answered (%d registered without an HTTP address)\n", r.Skipped)
		return 1
	}
	var ok []admin.EnforcerExplain
	var xs []enforcer.Explanation
	var ids []string
	seen := map[string]bool{}
	for i := range r.Enforcers {
		e := &r.Enforcers[i]
		var x enforcer.Explanation
		if e.Error == "" {
			if err := json.Unmarshal(e.Explain, &x); err != nil {
				e.Error = "the answer does not decode: " + err.Error()
			}
		}
		if e.Error != "" {
			failed++
			continue
		}
		ok, xs = append(ok, *e), append(xs, x)
		for _, re := range x.Rules {
			if !seen[re.Rule] {
				seen[re.Rule] = true
				ids = append(ids, re.Rule)
			}
		}
	}
	if len(ok) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		row := func(label string, cell func(i int, re *enforcer.RuleExplain) string, rule string) {
			fmt.Fprint(tw, label)
			for i := range ok {
				v := "-"
				if rule == "" {
					v = cell(i, nil)
				} else {
					for j := range xs[i].Rules {
						if xs[i].Rules[j].Rule == rule {
							v = cell(i, &xs[i].Rules[j])
						}
					}
				}
				fmt.Fprint(tw, "\t", v)
			}
			fmt.Fprintln(tw)
		}
		row("", func(i int, _ *enforcer.RuleExplain) string { return ok[i].Region + "/" + ok[i].ID }, "")
		row("rules version", func(i int, _ *enforcer.RuleExplain) string { return xs[i].RulesVersion }, "")
		for _, id := range ids {
			row("rule "+id, func(_ int, re *enforcer.RuleExplain) string {
				return fmt.Sprintf("%s by %s, specificity %d", re.Mode, re.By, re.Specificity)
			}, id)
			row("  why", func(_ int, re *enforcer.RuleExplain) string { return re.Why }, id)
			row("  share", func(_ int, re *enforcer.RuleExplain) string {
				return fmt.Sprintf("%.3f %s (default %.3f)", re.Share.Value, re.Share.Source, re.Share.Default)
			}, id)
			row("  share set", func(_ int, re *enforcer.RuleExplain) string {
				if re.Share.Version == 0 {
					return "none applied"
				}
				return fmt.Sprintf("v%d term %d, %.0fs old", re.Share.Version, re.Share.LeaderRev, re.Share.AgeSeconds)
			}, id)
			var names []string
			for _, x := range xs {
				for _, re := range x.Rules {
					if re.Rule == id {
						for _, l := range re.Limits {
							names = appendNew(names, l.Name)
						}
					}
				}
			}
			for _, name := range names {
				limit := func(re *enforcer.RuleExplain) *enforcer.LimitExplain {
					for i := range re.Limits {
						if re.Limits[i].Name == name {
							return &re.Limits[i]
						}
					}
					return nil
				}
				row("  "+name+" global", func(_ int, re *enforcer.RuleExplain) string {
					if l := limit(re); l != nil {
						return fmt.Sprintf("%s/s burst %s", round(l.GlobalRate), round(l.GlobalBurst))
					}
					return "-"
				}, id)
				row("  "+name+" here", func(_ int, re *enforcer.RuleExplain) string {
					if l := limit(re); l != nil {
						return fmt.Sprintf("%s/s burst %s", round(l.Rate), round(l.Burst))
					}
					return "-"
				}, id)
				row("  "+name+" level", func(_ int, re *enforcer.RuleExplain) string {
					switch l := limit(re); {
					case l == nil:
						return "-"
					case l.Level != nil:
						return strconv.FormatFloat(*l.Level, 'f', 1, 64)
					case l.LevelError != "":
						return "? (" + l.LevelError + ")"
					}
					return "?"
				}, id)
			}
			row("  recent", func(_ int, re *enforcer.RuleExplain) string { return summarize(re.Recent) }, id)
		}
		tw.Flush()
	}
	for _, e := range r.Enforcers {
		if e.Error != "" {
			fmt.Fprintf(w, "%s/%s (%s): %s\n", e.Region, e.ID, e.Addr, e.Error)
		}
	}
	return failed
}

// round prints a rate or a burst with at most two decimals and no trailing zeros:
// 166.66666666666666 as 166.67, 20 as 20.
func round(v float64) string {
	return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64)
}

func appendNew(s []string, v string) []string {
	for _, x := range s {
		if x == v {
			return s
		}
	}
	return append(s, v)
}

// summarize counts recent takes by outcome and source: "allowed memory×12, refused redis×3".
func summarize(ds []enforcer.RecentDecision) string {
	if len(ds) == 0 {
		return "none"
	}
	counts := map[string]int{}
	for _, d := range ds {
		k := "refused "
		if d.Allowed {
			k = "allowed "
		}
		counts[k+d.Source]++
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s×%d", k, counts[k])
	}
	return strings.Join(parts, ", ")
}
