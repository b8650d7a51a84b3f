package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/allot-dev/allot/pkg/balancer/admin"
	"github.com/allot-dev/allot/pkg/enforcer"
)

const cliUsage = `usage: balancer COMMAND [flags]   (the admin API's CLI; see pkg/balancer/admin)

  rules list
  rules apply -f FILE -reason WHY [-revision N] [-dry-run]
  rules check -f FILE
  rules delete ID -reason WHY [-revision N]
  override list
  override set KEY -rate R -per 1s [-burst B] [-limit name=rate/per[/burst]]... -expires T -reason WHY
  override delete KEY -reason WHY
  shares KEY
  explain KEY [-plan P] [-org O] [-endpoint "GET /v1/x"] [-ip A]
  audit [-n 20]

Every command takes -addr (balancer HTTP address; $ALLOT_ADMIN_ADDR, default
127.0.0.1:9091), -token-file FILE or -token-env VAR (default ALLOT_ADMIN_TOKEN: the
secret alone), -ca-file (TLS: the CA of the balancer's certificate), -timeout.
A change without -revision is compared on the revision read just before it.
`

// isCLI says whether args name an admin command (else they are the server's flags).
func isCLI(args []string) bool {
	if len(args) == 0 {
		return false
	}
	switch args[0] {
	case "rules", "override", "shares", "explain", "audit":
		return true
	}
	return false
}

type cliEnv struct {
	getenv func(string) string
	stdout io.Writer
	stderr io.Writer
}

// common holds the flags every command takes.
type common struct {
	addr, tokenFile, tokenEnv, caFile string
	timeout                           time.Duration
}

func (c *common) register(fs *flag.FlagSet, getenv func(string) string) {
	def := getenv("ALLOT_ADMIN_ADDR")
	if def == "" {
		def = "127.0.0.1:9091"
	}
	fs.StringVar(&c.addr, "addr", def, "balancer HTTP address (http://host:port or https://...)")
	fs.StringVar(&c.tokenFile, "token-file", "", "file holding the admin token (the secret alone)")
	fs.StringVar(&c.tokenEnv, "token-env", "ALLOT_ADMIN_TOKEN", "environment variable holding the admin token")
	fs.StringVar(&c.caFile, "ca-file", "", "CA certificate of the balancer's TLS certificate")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "bound of the whole command")
}

func (c *common) client(getenv func(string) string) (*admin.Client, error) {
	tok := ""
	if c.tokenFile != "" {
		b, err := os.ReadFile(c.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("while reading the token file: %w", err)
		}
		tok = strings.TrimSpace(string(b))
	} else if c.tokenEnv != "" {
		tok = strings.TrimSpace(getenv(c.tokenEnv))
	}
	if tok == "" {
		return nil, fmt.Errorf("no admin token: set -token-file or $%s", c.tokenEnv)
	}
	hc := &http.Client{Timeout: c.timeout}
	if c.caFile != "" {
		pem, err := os.ReadFile(c.caFile)
		if err != nil {
			return nil, fmt.Errorf("while reading the CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %q holds no PEM certificate", c.caFile)
		}
		hc.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	}
	return &admin.Client{Base: c.addr, Token: tok, HTTP: hc}, nil
}

// parseInterleaved parses flags found anywhere in args (Go's flag stops at the first
// positional) and returns the positionals.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
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

// cli runs an admin command: 0 done, 1 refused or failed, 2 bad usage.
func cli(args []string, env cliEnv) int {
	name := args[0]
	sub := ""
	rest := args[1:]
	if name == "rules" || name == "override" {
		if len(rest) == 0 {
			fmt.Fprint(env.stderr, cliUsage)
			return 2
		}
		sub, rest = rest[0], rest[1:]
	}
	help := func(a string) bool { return a == "-h" || a == "-help" || a == "--help" }
	if help(sub) || (sub != "" && len(rest) > 0 && help(rest[0])) {
		fmt.Fprint(env.stderr, cliUsage)
		return 0
	}
	if strings.HasPrefix(sub, "-") {
		fmt.Fprint(env.stderr, cliUsage)
		return 2
	}
	fs := flag.NewFlagSet("balancer "+strings.TrimSpace(name+" "+sub), flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	fs.Usage = func() { fmt.Fprint(env.stderr, cliUsage) }
	var c common
	c.register(fs, env.getenv)
	file := fs.String("f", "", "rule file (YAML)")
	reason := fs.String("reason", "", "why (kept in the audit record)")
	revision := fs.Int64("revision", 0, "the revision you read (default: read just before)")
	dryRun := fs.Bool("dry-run", false, "check the change against etcd and write nothing")
	rate := fs.Float64("rate", 0, "override: tokens per -per")
	per := fs.String("per", "1s", "override: period of -rate")
	burst := fs.Float64("burst", 0, "override: bucket capacity (default the rate)")
	expires := fs.String("expires", "", "override: RFC 3339 time or a duration from now (72h)")
	var limits limitsFlag
	fs.Var(&limits, "limit", "override: name=rate/per[/burst], repeatable")
	plan := fs.String("plan", "", "explain: the request's plan")
	org := fs.String("org", "", "explain: the request's org")
	endpoint := fs.String("endpoint", "", `explain: the request's endpoint ("GET /v1/search")`)
	ip := fs.String("ip", "", "explain: the client address")
	n := fs.Int("n", 20, "audit: records to show")
	pos, err := parseInterleaved(fs, rest)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		return 2
	}
	cl, err := c.client(env.getenv)
	if err != nil {
		fmt.Fprintln(env.stderr, "balancer:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	arg := func() (string, bool) {
		if len(pos) != 1 {
			fmt.Fprintf(env.stderr, "balancer %s %s: want exactly one argument, got %d\n", name, sub, len(pos))
			return "", false
		}
		return pos[0], true
	}
	var out any
	switch name + " " + sub {
	case "rules list":
		r, e := cl.Rules(ctx)
		if err = e; err == nil {
			printRules(env.stdout, r)
		}
	case "rules apply", "rules check":
		if *file == "" {
			fmt.Fprintf(env.stderr, "balancer rules %s: -f FILE is required\n", sub)
			return 2
		}
		data, e := os.ReadFile(*file)
		if e != nil {
			fmt.Fprintln(env.stderr, "balancer:", e)
			return 1
		}
		if sub == "check" {
			r, e := cl.Check(ctx, *file, string(data))
			if err = e; err == nil {
				if !r.OK {
					fmt.Fprintln(env.stderr, r.Error)
					return 1
				}
				fmt.Fprintf(env.stdout, "%s: ok, %d rules\n", *file, r.Rules)
			}
			break
		}
		out, err = cl.Apply(ctx, admin.ApplyRequest{Revision: *revision, Reason: *reason, File: *file, YAML: string(data), DryRun: *dryRun})
	case "rules delete":
		id, ok := arg()
		if !ok {
			return 2
		}
		out, err = cl.Delete(ctx, "rules", id, *reason, *revision)
	case "override list":
		r, e := cl.Overrides(ctx)
		if err = e; err == nil {
			printRules(env.stdout, r)
		}
	case "override set":
		key, ok := arg()
		if !ok {
			return 2
		}
		if *rate > 0 {
			limits = append(limitsFlag{{Name: "second", Rate: *rate, Per: *per, Burst: *burst}}, limits...)
		}
		exp := *expires
		if d, e := time.ParseDuration(exp); e == nil {
			exp = time.Now().Add(d).UTC().Format(time.RFC3339)
		}
		out, err = cl.SetOverride(ctx, key, admin.OverrideRequest{Revision: *revision, Reason: *reason, ExpiresAt: exp, Limits: limits, DryRun: *dryRun})
	case "override delete":
		key, ok := arg()
		if !ok {
			return 2
		}
		out, err = cl.Delete(ctx, "overrides", key, *reason, *revision)
	case "shares ":
		key, ok := arg()
		if !ok {
			return 2
		}
		r, e := cl.Shares(ctx, key)
		if err = e; err == nil {
			printShares(env.stdout, r)
		}
	case "explain ":
		key, ok := arg()
		if !ok {
			return 2
		}
		q := url.Values{"api_key": {key}}
		for k, v := range map[string]string{"plan": *plan, "org": *org, "endpoint": *endpoint, "ip": *ip} {
			if v != "" {
				q.Set(k, v)
			}
		}
		r, e := cl.Explain(ctx, q)
		if err = e; err == nil {
			printExplain(env.stdout, r)
		}
	case "audit ":
		r, e := cl.Audit(ctx, *n)
		if err = e; err == nil {
			tw := tabwriter.NewWriter(env.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "AT\tWHO\tACTION\tRULES\tREVISION\tREASON")
			for _, a := range r {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", a.At.Format(time.RFC3339), a.Who, a.Action, strings.Join(a.Rules, ","), a.Revision, a.Reason)
			}
			tw.Flush()
		}
	default:
		fmt.Fprint(env.stderr, cliUsage)
		return 2
	}
	if err != nil {
		printError(env.stderr, err)
		return 1
	}
	if res, ok := out.(admin.Result); ok {
		switch {
		case res.DryRun:
			fmt.Fprintf(env.stdout, "dry run: ok; would change %d rules: %s\n", len(res.Changed), strings.Join(res.Changed, ", "))
		case len(res.Changed) == 0:
			fmt.Fprintln(env.stdout, "nothing changed")
		default:
			fmt.Fprintf(env.stdout, "changed %d rules at revision %d: %s (audit %s)\n", len(res.Changed), res.Revision, strings.Join(res.Changed, ", "), res.Audit)
		}
	}
	return 0
}

func printError(w io.Writer, err error) {
	var e *admin.APIError
	if !errors.As(err, &e) {
		fmt.Fprintln(w, "balancer:", err)
		return
	}
	fmt.Fprintf(w, "balancer: refused (%d %s)\n", e.Status, http.StatusText(e.Status))
	if len(e.Problems) == 0 {
		fmt.Fprintln(w, e.ErrorResponse.Error)
	}
	for _, p := range e.Problems {
		fmt.Fprintln(w, p.Message)
	}
}

func printRules(w io.Writer, r admin.RulesResponse) {
	fmt.Fprintf(w, "revision %d, %d rules\n", r.Revision, len(r.Rules))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKEY\tMOD_REVISION\tRULE")
	for _, e := range r.Rules {
		body := e.Error
		if body == "" {
			var v any
			_ = json.Unmarshal(e.Rule, &v)
			b, _ := json.Marshal(v) // one line
			body = string(b)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", e.ID, e.Key, e.ModRevision, body)
	}
	tw.Flush()
}

func printShares(w io.Writer, r admin.SharesResponse) {
	fmt.Fprintf(w, "%s (from the %s", r.Identity, r.Source)
	if r.Source == "etcd" {
		fmt.Fprintf(w, ": version %d of term %d, published %s", r.Version, r.LeaderRev, r.PublishedAt.Format(time.RFC3339))
	}
	fmt.Fprintln(w, ")")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "RULE\tREGION\tSHARE\tDEFAULT\tTARGET\tDEMAND/s\n")
	for _, e := range r.Entries {
		for _, region := range r.Regions {
			note := ""
			if e.Default {
				note = " (default split)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%.3f%s\t%s\t%s\t%s\n", e.Rule, region, e.Shares[region], note, num(e.DefaultSplit, region), num(e.Target, region), num(e.Demand, region))
		}
	}
	tw.Flush()
}

func num(m map[string]float64, k string) string {
	if v, ok := m[k]; ok {
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
	return "-"
}

// printExplain prints the enforcers' answers side by side: a column per enforcer, a
// block of rows per rule.
func printExplain(w io.Writer, r admin.ExplainResponse) {
	if len(r.Enforcers) == 0 {
		fmt.Fprintf(w, "no enforcer answered (%d registered without an HTTP address)\n", r.Skipped)
		return
	}
	xs := make([]enforcer.Explanation, len(r.Enforcers))
	var ids []string
	seen := map[string]bool{}
	for i, e := range r.Enforcers {
		if e.Error == "" {
			_ = json.Unmarshal(e.Explain, &xs[i])
		}
		for _, re := range xs[i].Rules {
			if !seen[re.Rule] {
				seen[re.Rule] = true
				ids = append(ids, re.Rule)
			}
		}
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(label string, cell func(i int, re *enforcer.RuleExplain) string, rule string) {
		fmt.Fprint(tw, label)
		for i, e := range r.Enforcers {
			v := "-"
			switch {
			case e.Error != "":
				v = "error: " + e.Error
			case rule == "":
				v = cell(i, nil)
			default:
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
	row("", func(i int, _ *enforcer.RuleExplain) string { return r.Enforcers[i].Region + "/" + r.Enforcers[i].ID }, "")
	row("rules version", func(i int, _ *enforcer.RuleExplain) string { return xs[i].RulesVersion }, "")
	for _, id := range ids {
		row("rule "+id, func(_ int, re *enforcer.RuleExplain) string {
			return fmt.Sprintf("%s by %s, specificity %d", re.Mode, re.By, re.Specificity)
		}, id)
		row("  why", func(_ int, re *enforcer.RuleExplain) string { return re.Why }, id)
		row("  share", func(_ int, re *enforcer.RuleExplain) string {
			s := re.Share
			if s.Version == 0 {
				return fmt.Sprintf("%.3f %s (no share set applied)", s.Value, s.Source)
			}
			return fmt.Sprintf("%.3f %s (default %.3f; set v%d of term %d, %.0fs old)", s.Value, s.Source, s.Default, s.Version, s.LeaderRev, s.AgeSeconds)
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
			row("  "+name, func(_ int, re *enforcer.RuleExplain) string {
				for _, l := range re.Limits {
					if l.Name == name {
						lvl := "?"
						if l.Level != nil {
							lvl = strconv.FormatFloat(*l.Level, 'f', 1, 64)
						}
						return fmt.Sprintf("global %g/s burst %g; here %g/s burst %g; level %s", l.GlobalRate, l.GlobalBurst, l.Rate, l.Burst, lvl)
					}
				}
				return "-"
			}, id)
		}
		row("  recent", func(_ int, re *enforcer.RuleExplain) string { return summarize(re.Recent) }, id)
	}
	tw.Flush()
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
