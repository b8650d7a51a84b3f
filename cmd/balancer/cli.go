package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/allot-dev/allot/pkg/balancer/admin"
)

// The admin API's CLI, `balancer rules|override|shares|explain|audit ...`: cli finds the
// command, parses its own flag set (a flag it does not take is refused, naming the
// commands that do take it), connects (cli_conn.go) and runs it. The commands, and how
// each prints its answer: cli_rules.go, cli_override.go, cli_shares.go, cli_explain.go,
// cli_audit.go.

// cliUsage is the CLI's help: every command's usage line, then what they share.
func cliUsage() string {
	var b strings.Builder
	b.WriteString("usage: balancer COMMAND [flags]   (the admin API's CLI; see pkg/balancer/admin)\n\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "  %s\n", c.usage)
	}
	b.WriteString(cliShared)
	return b.String()
}

// cliShared ends cliUsage: the flags every command but "rules check" takes, and the exit
// status.
const cliShared = `
Every command but "rules check" talks to the balancer's admin API (on only with
admin.enabled, or -admin, and admin tokens) and takes -addr (balancer HTTP address;
$ALLOT_ADMIN_ADDR, default 127.0.0.1:9091), -token-file FILE (the secret alone, or the
balancer's tokens file of name:secret lines, with -token-name when it holds several) or
-token-env VAR (default ALLOT_ADMIN_TOKEN: the secret alone), -ca-file (TLS: the CA of
the balancer's certificate), -timeout. "rules check" checks the file here, as an
enforcer would, and needs no balancer. A change without -revision is compared on the
revision read just before it. A command takes only the flags on its line and these: any
other is refused. Exit status: 0 done, 1 refused or failed, 2 bad usage.
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

// command is one admin command: its name, its usage line and its own flags.
type command struct {
	name, usage string
	// local: it runs here, with no admin API to reach (rules check), so it takes none of
	// the connection flags.
	local bool
	// flags adds the command's own flags to fs and returns what runs it once they are
	// parsed.
	flags func(fs *flag.FlagSet) runFunc
}

// runFunc runs a parsed command with the admin API's client (nil for a local command) and
// its positional arguments. It returns a change's admin.Result, which cli prints, or an
// error: exit(n) when the command has said what is wrong itself, else one that printError
// explains (exit 1).
type runFunc func(ctx context.Context, cl *admin.Client, pos []string, env cliEnv) (any, error)

// exit is an error the command has printed already: cli exits with its status.
type exit int

func (e exit) Error() string { return "exit status " + strconv.Itoa(int(e)) }

// commands are the admin commands, in the order cliUsage lists them.
var commands = []command{
	{name: "rules list", usage: "rules list", flags: rulesList},
	{name: "rules apply", usage: "rules apply -f FILE -reason WHY [-revision N] [-dry-run]", flags: rulesApply},
	{name: "rules check", usage: "rules check -f FILE", local: true, flags: rulesCheck},
	{name: "rules delete", usage: "rules delete ID -reason WHY [-revision N]", flags: rulesDelete},
	{name: "override list", usage: "override list", flags: overrideList},
	{name: "override set", usage: "override set KEY -rate R -per 1s [-burst B] [-limit name=rate/per[/burst]]...\n" +
		"      -expires T -reason WHY [-revision N] [-dry-run]", flags: overrideSet},
	{name: "override delete", usage: "override delete KEY -reason WHY [-revision N]", flags: overrideDelete},
	{name: "shares", usage: "shares KEY", flags: sharesCmd},
	{name: "explain", usage: `explain KEY [-plan P] [-org O] [-endpoint "GET /v1/x"] [-ip A]`, flags: explainCmd},
	{name: "audit", usage: "audit [-n 20]", flags: auditCmd},
}

// lookup returns the command called name, or nil.
func lookup(name string) *command {
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

// flagSet is cmd's flag set: its own flags and, unless it is local, the connection flags
// (c). It prints nothing: cli says what is wrong, naming the command (flagError).
func (cmd *command) flagSet(getenv func(string) string) (fs *flag.FlagSet, c *common, run runFunc) {
	fs = flag.NewFlagSet("balancer "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	c = new(common)
	if !cmd.local {
		c.register(fs, getenv)
	}
	return fs, c, cmd.flags(fs)
}

// cli runs an admin command: 0 done, 1 refused or failed, 2 bad usage.
func cli(args []string, env cliEnv) int {
	name, sub, rest := args[0], "", args[1:]
	if name == "rules" || name == "override" {
		if len(rest) == 0 {
			fmt.Fprint(env.stderr, cliUsage())
			return 2
		}
		sub, rest = rest[0], rest[1:]
	}
	help := func(a string) bool { return a == "-h" || a == "-help" || a == "--help" }
	if help(sub) || (sub != "" && len(rest) > 0 && help(rest[0])) {
		fmt.Fprint(env.stderr, cliUsage())
		return 0
	}
	cmd := lookup(strings.TrimSpace(name + " " + sub))
	if cmd == nil {
		fmt.Fprint(env.stderr, cliUsage())
		return 2
	}
	fs, c, run := cmd.flagSet(env.getenv)
	pos, err := parseInterleaved(fs, rest)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(env.stderr, cliUsage())
		return 0
	}
	if err != nil {
		fmt.Fprint(env.stderr, flagError(cmd, err))
		return 2
	}
	if len(pos) > 0 && !cmd.takesArg() {
		fmt.Fprintf(env.stderr, "balancer %s: takes no arguments, got %q\nusage: balancer %s\n", cmd.name, pos, cmd.usage)
		return 2
	}
	ctx := context.Background()
	var cl *admin.Client
	if !cmd.local {
		if cl, err = c.client(env.getenv); err != nil {
			fmt.Fprintln(env.stderr, "balancer:", err)
			return 2
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	out, err := run(ctx, cl, pos, env)
	var code exit
	switch {
	case errors.As(err, &code):
		return int(code)
	case err != nil:
		printError(env.stderr, err)
		return 1
	}
	if res, ok := out.(admin.Result); ok {
		printResult(env.stdout, res)
	}
	return 0
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

// notDefined is how package flag words a flag the set does not have.
const notDefined = "flag provided but not defined: -"

// flagError says what is wrong with the flags given to cmd, and how to call it: a flag it
// does not take is named with the commands that take it.
func flagError(cmd *command, err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, notDefined); ok {
		msg = fmt.Sprintf("-%s is not a flag of %s", name, cmd.name)
		var by []string
		for i := range commands {
			if o := &commands[i]; o != cmd {
				if fs, _, _ := o.flagSet(noEnv); fs.Lookup(name) != nil {
					by = append(by, o.name)
				}
			}
		}
		conn := flag.NewFlagSet("", flag.ContinueOnError)
		new(common).register(conn, noEnv)
		switch {
		case cmd.local && conn.Lookup(name) != nil:
			msg += fmt.Sprintf(" (it reaches the admin API: %s runs here, with no balancer)", cmd.name)
		case len(by) > 0:
			msg += " (a flag of " + strings.Join(by, ", ") + ")"
		}
	}
	return fmt.Sprintf("balancer %s: %s\nusage: balancer %s\n%s\n", cmd.name, msg, cmd.usage, cmd.takes())
}

// takesArg says whether cmd takes a positional argument: its usage names one (KEY, ID)
// right after the command's name.
func (cmd *command) takesArg() bool {
	f := strings.Fields(strings.TrimPrefix(cmd.usage, cmd.name))
	return len(f) > 0 && f[0] == strings.ToUpper(f[0]) && !strings.HasPrefix(f[0], "-") && !strings.HasPrefix(f[0], "[")
}

// takes lists the flags cmd takes: its own, then the connection flags.
func (cmd *command) takes() string {
	var own, conn []string
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	cmd.flags(fs)
	fs.VisitAll(func(f *flag.Flag) { own = append(own, "-"+f.Name) })
	s := cmd.name + " takes " + strings.Join(own, ", ")
	if len(own) == 0 {
		s = cmd.name + " takes no flags of its own"
	}
	if !cmd.local {
		fs := flag.NewFlagSet("", flag.ContinueOnError)
		new(common).register(fs, noEnv)
		fs.VisitAll(func(f *flag.Flag) { conn = append(conn, "-"+f.Name) })
		s += ", and the connection flags " + strings.Join(conn, ", ")
	}
	return s
}

func noEnv(string) string { return "" }

// one is the one positional argument (a key or a rule id) of the command called name.
func one(name string, pos []string, env cliEnv) (string, error) {
	if len(pos) != 1 {
		fmt.Fprintf(env.stderr, "balancer %s: want exactly one argument, got %d\n", name, len(pos))
		return "", exit(2)
	}
	return pos[0], nil
}

// changeFlags adds the flags of a change: why, and the revision it is compared on.
func changeFlags(fs *flag.FlagSet) (reason *string, revision *int64) {
	reason = fs.String("reason", "", "why (kept in the audit record)")
	revision = fs.Int64("revision", 0, "the revision you read (default: read just before)")
	return reason, revision
}

// dryRunFlag adds -dry-run, which a change that writes rules takes (a delete does not).
func dryRunFlag(fs *flag.FlagSet) *bool {
	return fs.Bool("dry-run", false, "check the change against etcd and write nothing")
}

// printResult prints the answer to a change.
func printResult(w io.Writer, res admin.Result) {
	switch {
	case res.DryRun:
		fmt.Fprintf(w, "dry run: ok; would change %d rules: %s\n", len(res.Changed), strings.Join(res.Changed, ", "))
	case len(res.Changed) == 0:
		fmt.Fprintln(w, "nothing changed")
	default:
		fmt.Fprintf(w, "changed %d rules at revision %d: %s (audit %s)\n", len(res.Changed), res.Revision, strings.Join(res.Changed, ", "), res.Audit)
	}
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
