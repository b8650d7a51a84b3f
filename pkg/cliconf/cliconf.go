// Package cliconf builds a process's configuration the way every allot binary does: the
// defaults, then a YAML config file (-config or ALLOT_CONFIG), then ALLOT_* environment
// variables, then command-line flags, each layer overriding the one before.
//
// A program describes its settings once, as a table of Overrides over its own Config
// type; each Override is registered as a flag and read from the environment variable
// EnvName gives it, so the two can never disagree. The typed setters (Str, List, Dur,
// Int, Bool, Float) parse a value into one field; a program writes its own Apply for
// anything else (a region=weight list, say).
//
// Which way it errs: a value that does not parse is an error naming the flag or the
// variable and the value, never a silent default. A flag's value is checked as it is
// parsed (against a zero Config), so a bad flag fails before any file is read. An
// environment variable set to "" counts as unset.
//
// cliconf adds no package prefix of its own to its errors: Command.Prefix (e.g. "app: ")
// starts them, so a program's messages read as its own.
package cliconf

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Override is one setting of C that a flag and an environment variable can change.
type Override[C any] struct {
	// Name is the flag's name; the environment variable is EnvName(Name).
	Name string
	// Usage is the flag's help text; Parse appends " (env ALLOT_…)".
	Usage string
	// IsBool makes the flag a boolean one: -name alone means true.
	IsBool bool
	// Apply parses v into c, or says why v is bad.
	Apply func(c *C, v string) error
}

// EnvName is the environment variable for flag name: ALLOT_ + upper case, '-' → '_'.
func EnvName(flagName string) string {
	return "ALLOT_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Str sets the string field dst picks out of the config to v, as it is.
func Str[C any](dst func(*C) *string) func(*C, string) error {
	return func(c *C, v string) error { *dst(c) = v; return nil }
}

// List sets a string slice from a comma-separated v; items are trimmed and empty ones
// dropped ("a:1, b:2," is [a:1 b:2]; "" is nil).
func List[C any](dst func(*C) *[]string) func(*C, string) error {
	return func(c *C, v string) error {
		var out []string
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
		*dst(c) = out
		return nil
	}
}

// Dur sets a duration field from v as time.ParseDuration reads it ("250ms", "2s").
func Dur[C any](dst func(*C) *time.Duration) func(*C, string) error {
	return parsed(dst, time.ParseDuration)
}

// Int sets an int field from a decimal v.
func Int[C any](dst func(*C) *int) func(*C, string) error {
	return parsed(dst, strconv.Atoi)
}

// Bool sets a bool field from v as strconv.ParseBool reads it (1, t, true, 0, f, false…).
func Bool[C any](dst func(*C) *bool) func(*C, string) error {
	return parsed(dst, strconv.ParseBool)
}

// Float sets a float64 field from v.
func Float[C any](dst func(*C) *float64) func(*C, string) error {
	return parsed(dst, func(v string) (float64, error) { return strconv.ParseFloat(v, 64) })
}

// parsed sets the field dst picks out to parse(v); on an error the field is left alone.
func parsed[C, T any](dst func(*C) *T, parse func(string) (T, error)) func(*C, string) error {
	return func(c *C, v string) error {
		x, err := parse(v)
		if err != nil {
			return err
		}
		*dst(c) = x
		return nil
	}
}

// LoadYAML decodes the YAML file at path into cfg, which holds the defaults: fields the
// file leaves out keep them. Unknown fields are errors. Errors are "while reading config:
// …" or "config <path>: …", for the caller to prefix.
func LoadYAML[C any](path string, cfg *C) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("while reading config: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(cfg); err != nil {
		return fmt.Errorf("config %s: %w", path, err)
	}
	return nil
}

// ErrVersion is Parse's error when -version was given: the program prints its version
// (pkg/version) and exits 0. Nothing else is read: not the config file, not the
// environment.
var ErrVersion = errors.New("version requested")

// Command is one program's command line. The zero value is not usable: Name, Default
// and Overrides are needed. Parse does not change a Command, so one may serve concurrent
// calls.
type Command[C any] struct {
	// Name names the program in its usage line and its flag set, e.g. "enforcer".
	Name string
	// Synopsis are more usage lines after "usage: <Name> [flags]", e.g. a subcommand's.
	Synopsis []string
	// ConfigExample is a config file named in the -config flag's help.
	ConfigExample string
	// Prefix starts the errors Parse and LoadFile make (not the flag package's nor
	// Validate's), e.g. "app: ".
	Prefix string
	// Overrides are the settings flags and ALLOT_* variables change.
	Overrides []Override[C]
	// Default returns the configuration without a file.
	Default func() C
	// Validate, if set, checks the result of Parse; its error is returned as it is.
	Validate func(*C) error
	// Foreign, if set, reads another program's environment variables into the
	// configuration (a compatibility layer): Parse calls it after the config file and
	// before the ALLOT_* variables, so it overrides the file and they override it.
	// fileGiven says whether a config file was read. Its error is returned with Prefix.
	Foreign func(c *C, getenv func(string) string, fileGiven bool) error
}

// LoadFile reads the YAML config file at path over Default (see LoadYAML).
func (cmd *Command[C]) LoadFile(path string) (C, error) {
	cfg := cmd.Default()
	if err := LoadYAML(path, &cfg); err != nil {
		return cfg, fmt.Errorf("%s%w", cmd.Prefix, err)
	}
	return cfg, nil
}

// usage is -h's text before the flags' defaults.
func (cmd *Command[C]) usage() string {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: %s [flags]\n", cmd.Name)
	for _, s := range cmd.Synopsis {
		fmt.Fprintf(&b, "       %s\n", s)
	}
	b.WriteString("\nflags override the config file; ALLOT_* variables override it too, flags win:\n\n")
	return b.String()
}

// Parse builds the configuration from, in increasing precedence: Default, the config
// file (-config, else ALLOT_CONFIG; read by Load), Foreign's variables if set, ALLOT_*
// environment variables, and flags. A variable is not read for a setting a flag gives. getenv is os.Getenv in main.
// Usage and the flag package's errors go to out. On -h or -help the error is
// flag.ErrHelp; on -version it is ErrVersion, before any file or variable is read. Last
// it calls Validate.
func (cmd *Command[C]) Parse(args []string, getenv func(string) string, out io.Writer) (C, error) {
	var zero C
	fs := flag.NewFlagSet(cmd.Name, flag.ContinueOnError)
	fs.SetOutput(out)
	configPath := fs.String("config", "", "YAML config file, e.g. "+cmd.ConfigExample+" (env ALLOT_CONFIG)")
	showVersion := fs.Bool("version", false, "print the version, the commit and the Go version, and exit")
	checkOnly := fs.Bool("check-config", false, "check the configuration (file, ALLOT_* variables, flags) and the files it names, then exit: 0 valid, 1 a named file or variable is wrong, 2 a setting is")
	type given struct {
		o *Override[C]
		v string
	}
	var flags []given
	for i := range cmd.Overrides {
		o := &cmd.Overrides[i]
		usage := o.Usage + " (env " + EnvName(o.Name) + ")"
		rec := func(v string) error {
			flags = append(flags, given{o, v})
			var scratch C
			return o.Apply(&scratch, v)
		}
		if o.IsBool {
			fs.BoolFunc(o.Name, usage, rec)
		} else {
			fs.Func(o.Name, usage, rec)
		}
	}
	fs.Usage = func() {
		fmt.Fprint(out, cmd.usage())
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return zero, err
	}
	if *showVersion {
		return zero, ErrVersion
	}
	if fs.NArg() > 0 {
		return zero, fmt.Errorf("%sunexpected arguments %q", cmd.Prefix, fs.Args())
	}
	path := *configPath
	if path == "" {
		path = getenv("ALLOT_CONFIG")
	}
	cfg := cmd.Default()
	if path != "" {
		var err error
		if cfg, err = cmd.LoadFile(path); err != nil {
			return zero, err
		}
	}
	if cmd.Foreign != nil {
		if err := cmd.Foreign(&cfg, getenv, path != ""); err != nil {
			return zero, fmt.Errorf("%s%w", cmd.Prefix, err)
		}
	}
	set := map[string]bool{}
	for _, g := range flags {
		set[g.o.Name] = true
	}
	for i := range cmd.Overrides {
		o := &cmd.Overrides[i]
		if set[o.Name] {
			continue
		}
		if v := getenv(EnvName(o.Name)); v != "" {
			if err := o.Apply(&cfg, v); err != nil {
				return zero, fmt.Errorf("%s%s=%q: %w", cmd.Prefix, EnvName(o.Name), v, err)
			}
		}
	}
	for _, g := range flags {
		if err := g.o.Apply(&cfg, g.v); err != nil { // checked at parse; cannot fail here
			return zero, fmt.Errorf("%s-%s %q: %w", cmd.Prefix, g.o.Name, g.v, err)
		}
	}
	if cmd.Validate != nil {
		if err := cmd.Validate(&cfg); err != nil {
			return zero, err
		}
	}
	if *checkOnly {
		return cfg, ErrCheckConfig
	}
	return cfg, nil
}

// ErrCheckConfig is returned by Parse, with the configuration, when -check-config was given
// and the configuration passed Validate: the program is to check what it can without
// starting (the files the configuration names, the ALLOT_* variables set; see
// UnknownEnv), say so, and exit. A program that does not handle it exits as on any error.
var ErrCheckConfig = errors.New("-check-config: the configuration is valid")

// IsCheckConfig reports whether err is Parse's -check-config answer.
func IsCheckConfig(err error) bool { return errors.Is(err, ErrCheckConfig) }

// EnvNames are the environment variables Parse reads: ALLOT_CONFIG and one per Override.
func (cmd *Command[C]) EnvNames() []string {
	names := []string{"ALLOT_CONFIG"}
	for _, o := range cmd.Overrides {
		names = append(names, EnvName(o.Name))
	}
	return names
}

// UnknownEnv returns, sorted, the names of the ALLOT_* variables in environ ("NAME=value"
// entries, as os.Environ gives them) that are neither in EnvNames nor in also (variables
// the program reads by other means, e.g. a tokens variable its config names). Parse
// ignores such a variable, so a misspelt one would silently change nothing: -check-config
// refuses them.
func (cmd *Command[C]) UnknownEnv(environ []string, also ...string) []string {
	known := map[string]bool{}
	for _, n := range slices.Concat(cmd.EnvNames(), also) {
		known[n] = true
	}
	var unknown []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "ALLOT_") && !known[name] && !slices.Contains(unknown, name) {
			unknown = append(unknown, name)
		}
	}
	slices.Sort(unknown)
	return unknown
}

// HostPID is the default ID of a process, for its logs and registrations: the host name
// ('/' made '_') and the process id, "host-1234".
func HostPID() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d", strings.ReplaceAll(host, "/", "_"), os.Getpid())
}
