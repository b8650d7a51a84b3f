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
	"math"
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
	"github.com/allot-dev/allot/pkg/rules"
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

Every command but "rules check" talks to the balancer's admin API (on only with
admin.enabled, or -admin, and admin tokens) and takes -addr (balancer HTTP address;
$ALLOT_ADMIN_ADDR, default 127.0.0.1:9091), -token-file FILE (the secret alone, or the
balancer's tokens file of name:secret lines, with -token-name when it holds several) or
-token-env VAR (default ALLOT_ADMIN_TOKEN: the secret alone), -ca-file (TLS: the CA of
the balancer's certificate), -timeout. "rules check" checks the file here, as an
enforcer would, and needs no balancer. A change without -revision is compared on the
revision read just before it. Exit status: 0 done, 1 refused or failed, 2 bad usage.
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
	addr, tokenFile, tokenName, tokenEnv, caFile string
	timeout                                      time.Duration
}

func (c *common) register(fs *flag.FlagSet, getenv func(string) string) {
	def := getenv("ALLOT_ADMIN_ADDR")
	if def == "" {
		def = "127.0.0.1:9091"
	}
	fs.StringVar(&c.addr, "addr", def, "balancer HTTP address (http://host:port or https://...)")
	fs.StringVar(&c.tokenFile, "token-file", "", "file holding the admin token: the secret alone, or name:secret lines (the balancer's tokens file)")
	fs.StringVar(&c.tokenName, "token-name", "", "with -token-file of name:secret lines: which token to use")
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
		if tok, err = secretFrom(string(b), c.tokenFile, c.tokenName); err != nil {
			return nil, err
		}
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

// secretFrom reads the secret in a -token-file: the secret alone on one line, or
// name:secret lines (the balancer's admin.tokens_file, '#' comments and blank lines
// skipped), of which name picks one (needed when there are several). A line without ':'
// is a secret alone. The secret never appears in an error.
func secretFrom(text, file, name string) (string, error) {
	type entry struct{ name, secret string }
	var entries []entry
	for line := range strings.SplitSeq(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		n, sec, ok := strings.Cut(line, ":")
		if !ok {
			n, sec = "", line
		}
		entries = append(entries, entry{strings.TrimSpace(n), strings.TrimSpace(sec)})
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.name)
		if name != "" && e.name == name {
			return e.secret, nil
		}
	}
	switch {
	case len(entries) == 0:
		return "", fmt.Errorf("token file %s holds no token", file)
	case name != "":
		return "", fmt.Errorf("token file %s has no token named %q (it has: %s)", file, name, strings.Join(names, ", "))
	case len(entries) > 1:
		return "", fmt.Errorf("token file %s holds %d tokens (%s): pick one with -token-name", file, len(entries), strings.Join(names, ", "))
	}
	return entries[0].secret, nil
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
	if name+" "+sub == "rules check" {
		return checkLocal(*file, env)
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
			printRules(env.stdout, r, time.Now())
		}
	case "rules apply":
		if *file == "" {
			fmt.Fprintf(env.stderr, "balancer rules %s: -f FILE is required\n", sub)
			return 2
		}
		data, e := os.ReadFile(*file)
		if e != nil {
			fmt.Fprintln(env.stderr, "balancer:", e)
			return 1
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
			printRules(env.stdout, r, time.Now())
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
			if failed := printExplain(env.stdout, r); failed > 0 {
				fmt.Fprintf(env.stderr, "balancer explain: %d of %d enforcers did not answer\n", failed, len(r.Enforcers))
				return 1
			}
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

// noAdminAPI is the hint for a 404 without the admin API's own error (a balancer too old
// to say, or something else listening at -addr).
const noAdminAPI = "no admin API at this address: is -addr / $ALLOT_ADMIN_ADDR the balancer's HTTP address, " +
	"and was it started with admin.enabled (-admin) and admin tokens? (README: \"Changing limits\")"

func printError(w io.Writer, err error) {
	var e *admin.APIError
	if !errors.As(err, &e) {
		var ue *url.Error
		if errors.As(err, &ue) {
			fmt.Fprintf(w, "balancer: cannot reach the admin API at %s: %v (is -addr / $ALLOT_ADMIN_ADDR the balancer's HTTP address, and is it running?)\n", ue.URL, ue.Err)
			return
		}
		fmt.Fprintln(w, "balancer:", err)
		return
	}
	if e.Status == http.StatusNotFound && strings.TrimSpace(e.ErrorResponse.Error) == "404 page not found" {
		fmt.Fprintln(w, "balancer:", noAdminAPI)
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
