package cliconf

import (
	"errors"
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/tlsfiles"
)

type testConfig struct {
	Name  string          `yaml:"name"`
	Addrs []string        `yaml:"addrs"`
	Wait  time.Duration   `yaml:"wait"`
	Count int             `yaml:"count"`
	On    bool            `yaml:"on"`
	Ratio float64         `yaml:"ratio"`
	TLS   tlsfiles.Client `yaml:"tls"`
}

var testOverrides = append([]Override[testConfig]{
	{Name: "name", Usage: "a name", Apply: Str(func(c *testConfig) *string { return &c.Name })},
	{Name: "addrs", Usage: "addresses", Apply: List(func(c *testConfig) *[]string { return &c.Addrs })},
	{Name: "wait", Usage: "a wait", Apply: Dur(func(c *testConfig) *time.Duration { return &c.Wait })},
	{Name: "count", Usage: "a count", Apply: Int(func(c *testConfig) *int { return &c.Count })},
	{Name: "on", Usage: "on or off", IsBool: true, Apply: Bool(func(c *testConfig) *bool { return &c.On })},
	{Name: "ratio", Usage: "a ratio", Apply: Float(func(c *testConfig) *float64 { return &c.Ratio })},
}, ClientTLS("store", "the store", func(c *testConfig) *tlsfiles.Client { return &c.TLS })...)

func testCommand() *Command[testConfig] {
	return &Command[testConfig]{
		Name: "test", ConfigExample: "test.yaml", Prefix: "app: ", Overrides: testOverrides,
		Default: func() testConfig { return testConfig{Name: "default", Count: 1} },
		Validate: func(c *testConfig) error {
			if c.Count < 0 {
				return errors.New("count is negative")
			}
			return nil
		},
	}
}

func override(t *testing.T, name string) Override[testConfig] {
	t.Helper()
	for _, o := range testOverrides {
		if o.Name == name {
			return o
		}
	}
	t.Fatalf("no override %q", name)
	return Override[testConfig]{}
}

func TestParsers(t *testing.T) {
	for _, tc := range []struct {
		name, v string
		want    testConfig // the zero config with v applied; ignored when err is set
		err     string     // "" when v is good
	}{
		{name: "name", v: "x y", want: testConfig{Name: "x y"}},
		{name: "addrs", v: " a:1, b:2,,", want: testConfig{Addrs: []string{"a:1", "b:2"}}},
		{name: "addrs", v: ",", want: testConfig{}},
		{name: "wait", v: "250ms", want: testConfig{Wait: 250 * time.Millisecond}},
		{name: "wait", v: "5", err: `missing unit in duration "5"`},
		{name: "count", v: "-3", want: testConfig{Count: -3}},
		{name: "count", v: "1.5", err: `parsing "1.5": invalid syntax`},
		{name: "on", v: "true", want: testConfig{On: true}},
		{name: "on", v: "0", want: testConfig{}},
		{name: "on", v: "yes", err: `parsing "yes": invalid syntax`},
		{name: "ratio", v: "0.25", want: testConfig{Ratio: 0.25}},
		{name: "ratio", v: "a quarter", err: `parsing "a quarter": invalid syntax`},
		{name: "store-tls", v: "true", want: testConfig{TLS: tlsfiles.Client{Enabled: true}}},
		{name: "store-tls", v: "maybe", err: `parsing "maybe": invalid syntax`},
		{name: "store-tls-ca", v: "ca.pem", want: testConfig{TLS: tlsfiles.Client{CAFile: "ca.pem"}}},
		{name: "store-tls-cert", v: "c.pem", want: testConfig{TLS: tlsfiles.Client{CertFile: "c.pem"}}},
		{name: "store-tls-key", v: "k.pem", want: testConfig{TLS: tlsfiles.Client{KeyFile: "k.pem"}}},
		{name: "store-tls-server-name", v: "redis.local", want: testConfig{TLS: tlsfiles.Client{ServerName: "redis.local"}}},
	} {
		var c testConfig
		err := override(t, tc.name).Apply(&c, tc.v)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("-%s %q: %v, want an error with %q", tc.name, tc.v, err, tc.err)
		case tc.err != "" && !reflect.DeepEqual(c, testConfig{}):
			t.Errorf("-%s %q: a bad value changed the config: %+v", tc.name, tc.v, c)
		case tc.err == "" && (err != nil || !reflect.DeepEqual(c, tc.want)):
			t.Errorf("-%s %q: %+v (%v), want %+v", tc.name, tc.v, c, err, tc.want)
		}
	}
}

func TestClientTLSUsage(t *testing.T) {
	got := map[string]string{}
	for _, o := range ClientTLS("etcd", "etcd", func(c *testConfig) *tlsfiles.Client { return &c.TLS }) {
		got[o.Name] = o.Usage
		if o.IsBool != (o.Name == "etcd-tls") {
			t.Errorf("%s: IsBool %v", o.Name, o.IsBool)
		}
	}
	want := map[string]string{
		"etcd-tls": "use TLS to etcd", "etcd-tls-ca": "CA file for etcd TLS",
		"etcd-tls-cert": "client certificate for etcd TLS", "etcd-tls-key": "client key for etcd TLS",
		"etcd-tls-server-name": "server name to verify for etcd TLS",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ClientTLS: %v, want %v", got, want)
	}
}

func TestEnvName(t *testing.T) {
	for in, want := range map[string]string{"peers": "ALLOT_PEERS", "redis-tls-ca": "ALLOT_REDIS_TLS_CA"} {
		if got := EnvName(in); got != want {
			t.Errorf("EnvName(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestPrecedence: defaults < file < environment < flags, setting by setting.
func TestPrecedence(t *testing.T) {
	const file = "testdata/good.yaml" // name: file, count: 2, wait: 1s
	for _, tc := range []struct {
		what string
		args []string
		env  map[string]string
		want testConfig
	}{
		{"defaults", nil, nil, testConfig{Name: "default", Count: 1}},
		{"file over defaults", []string{"-config", file}, nil, testConfig{Name: "file", Count: 2, Wait: time.Second}},
		{"ALLOT_CONFIG names the file", nil, map[string]string{"ALLOT_CONFIG": file}, testConfig{Name: "file", Count: 2, Wait: time.Second}},
		{"-config beats ALLOT_CONFIG", []string{"-config", file}, map[string]string{"ALLOT_CONFIG": "/nonexistent"}, testConfig{Name: "file", Count: 2, Wait: time.Second}},
		{"env over file", []string{"-config", file}, map[string]string{"ALLOT_NAME": "env", "ALLOT_ON": "true"},
			testConfig{Name: "env", Count: 2, Wait: time.Second, On: true}},
		{"an empty variable is unset", []string{"-config", file}, map[string]string{"ALLOT_NAME": ""}, testConfig{Name: "file", Count: 2, Wait: time.Second}},
		{"flag over env", []string{"-config", file, "-name", "flag", "-on=false"}, map[string]string{"ALLOT_NAME": "env", "ALLOT_ON": "true", "ALLOT_COUNT": "3"},
			testConfig{Name: "flag", Count: 3, Wait: time.Second}},
		{"a flagged setting's variable is not read", []string{"-count", "4"}, map[string]string{"ALLOT_COUNT": "bad"}, testConfig{Name: "default", Count: 4}},
		{"the last flag wins", []string{"-name", "a", "-name", "b", "-on"}, nil, testConfig{Name: "b", Count: 1, On: true}},
	} {
		got, err := testCommand().Parse(tc.args, func(k string) string { return tc.env[k] }, io.Discard)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %+v (%v), want %+v", tc.what, got, err, tc.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	const bad = "testdata/bad.yaml" // an unknown field on line 2
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"-count", "x"}, nil, `invalid value "x" for flag -count`},
		{[]string{"-nope"}, nil, "flag provided but not defined: -nope"},
		{[]string{"extra"}, nil, `app: unexpected arguments ["extra"]`},
		{nil, map[string]string{"ALLOT_WAIT": "soon"}, `app: ALLOT_WAIT="soon": time: invalid duration "soon"`},
		{[]string{"-config", "/nonexistent"}, nil, "app: while reading config: open /nonexistent"},
		{[]string{"-config", bad}, nil, "app: config " + bad + ": yaml: unmarshal errors:\n  line 2: field bogus not found"},
		{[]string{"-count", "-1"}, nil, "count is negative"},
	} {
		_, err := testCommand().Parse(tc.args, func(k string) string { return tc.env[k] }, io.Discard)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Parse(%q, %v): %v, want %q", tc.args, tc.env, err, tc.want)
		}
	}
}

func TestHelp(t *testing.T) {
	var out strings.Builder
	cmd := testCommand()
	cmd.Synopsis = []string{"test sub ARG"}
	if _, err := cmd.Parse([]string{"-h"}, func(string) string { return "" }, &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{
		"usage: test [flags]\n       test sub ARG\n\nflags override the config file; ALLOT_* variables override it too, flags win:\n\n",
		"YAML config file, e.g. test.yaml (env ALLOT_CONFIG)",
		"a count (env ALLOT_COUNT)",
		"use TLS to the store (env ALLOT_STORE_TLS)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("usage lacks %q:\n%s", want, out.String())
		}
	}
}

// -version stops Parse before anything is read or checked: a config file that does not
// exist, a bad variable and a config that fails Validate do not hide it.
func TestVersion(t *testing.T) {
	env := map[string]string{"ALLOT_CONFIG": "/nonexistent", "ALLOT_WAIT": "soon"}
	for _, args := range [][]string{{"-version"}, {"--version"}, {"-count", "-1", "-version"}, {"-version", "-config", "/nonexistent"}} {
		_, err := testCommand().Parse(args, func(k string) string { return env[k] }, io.Discard)
		if !errors.Is(err, ErrVersion) {
			t.Errorf("Parse(%q): %v, want ErrVersion", args, err)
		}
	}
	if _, err := testCommand().Parse([]string{"-version", "-nope"}, func(string) string { return "" }, io.Discard); err == nil || errors.Is(err, ErrVersion) {
		t.Errorf("a flag it does not know beside -version: %v, want the flag error", err)
	}
	var out strings.Builder
	testCommand().Parse([]string{"-h"}, func(string) string { return "" }, &out)
	if !strings.Contains(out.String(), "-version") {
		t.Errorf("usage does not list -version:\n%s", out.String())
	}
}

// -check-config hands back the configuration with ErrCheckConfig once it is valid, and
// the errors as usual when it is not; UnknownEnv names the ALLOT_* variables nothing reads.
func TestCheckConfig(t *testing.T) {
	cmd := testCommand()
	env := func(string) string { return "" }
	cfg, err := cmd.Parse([]string{"-check-config", "-count", "3"}, env, io.Discard)
	if !IsCheckConfig(err) || cfg.Count != 3 {
		t.Fatalf("-check-config -count 3: %+v, %v; want the config and ErrCheckConfig", cfg, err)
	}
	if _, err := cmd.Parse([]string{"-check-config", "-count", "-1"}, env, io.Discard); err == nil || IsCheckConfig(err) {
		t.Fatalf("-check-config with an invalid config: %v, want Validate's error", err)
	}
	if _, err := cmd.Parse([]string{"-check-config", "-no-such-flag"}, env, io.Discard); err == nil || IsCheckConfig(err) {
		t.Fatalf("-check-config with an unknown flag: %v, want the flag error", err)
	}
	if _, err := cmd.Parse([]string{"-count", "3"}, env, io.Discard); err != nil {
		t.Fatalf("without -check-config: %v", err)
	}

	environ := []string{"PATH=/bin", "ALLOT_COUNT=2", "ALLOT_CONFIG=x.yaml", "ALLOT_CUONT=2", "ALLOT_TOKENS=a:b", "ALLOT_STORE_TLS_CA=ca.pem", "ALLOT_AAA=", "ALLOT_CUONT=3"}
	if got, want := cmd.UnknownEnv(environ, "ALLOT_TOKENS"), []string{"ALLOT_AAA", "ALLOT_CUONT"}; !reflect.DeepEqual(got, want) {
		t.Errorf("UnknownEnv: %q, want %q", got, want)
	}
}

// Foreign's variables sit over the file and under ALLOT_* and the flags; it is told
// whether a file was read, and its error carries the prefix.
func TestForeign(t *testing.T) {
	cmd := testCommand()
	var sawFile bool
	cmd.Foreign = func(c *testConfig, getenv func(string) string, fileGiven bool) error {
		sawFile = fileGiven
		if v := getenv("THEIR_NAME"); v != "" {
			c.Name = v
		}
		if v := getenv("THEIR_COUNT"); v != "" {
			c.Count = len(v)
		}
		if getenv("THEIR_BAD") != "" {
			return errors.New("THEIR_BAD: no")
		}
		return nil
	}
	env := map[string]string{"THEIR_NAME": "theirs", "THEIR_COUNT": "xxx", "ALLOT_COUNT": "7"}
	getenv := func(k string) string { return env[k] }
	cfg, err := cmd.Parse(nil, getenv, io.Discard)
	if err != nil || cfg.Name != "theirs" || cfg.Count != 7 || sawFile {
		t.Fatalf("Parse: %+v, %v, file %v: want their name, ALLOT_COUNT over their count, no file", cfg, err, sawFile)
	}
	cfg, err = cmd.Parse([]string{"-config", "testdata/good.yaml"}, getenv, io.Discard)
	if err != nil || cfg.Name != "theirs" || !sawFile {
		t.Fatalf("Parse with a file: %+v, %v, file %v: want their name over the file's", cfg, err, sawFile)
	}
	cfg, err = cmd.Parse([]string{"-name", "flag"}, getenv, io.Discard)
	if err != nil || cfg.Name != "flag" {
		t.Fatalf("Parse with -name: %+v, %v", cfg, err)
	}
	env["THEIR_BAD"] = "1"
	if _, err := cmd.Parse(nil, getenv, io.Discard); err == nil || err.Error() != "app: THEIR_BAD: no" {
		t.Fatalf("Parse: %v, want Foreign's error with the prefix", err)
	}
}
