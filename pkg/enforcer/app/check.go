package app

import (
	"errors"
	"fmt"
	"strings"

	"github.com/allot-dev/allot/pkg/adminauth"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/allot-dev/allot/pkg/tlsfiles"
)

// Check is `enforcer -check-config`: what New would refuse at start that can be known
// without the network, for a configuration Parse already validated. It reads every file
// the configuration names — the rules file, loaded and compiled for this region exactly as
// New compiles it; the PEM files of store.tls, etcd.tls and (with reports on)
// balancer.tls; explain's tokens when explain is on — and refuses any ALLOT_* variable in
// environ ("NAME=value" entries, os.Environ's form) that the enforcer does not read, so a
// misspelt variable cannot pass for a setting. It dials nothing and binds nothing: Redis,
// etcd and the balancer being unreachable is a matter for the running process (which
// starts and degrades, see /readyz), not for the configuration. Every problem is named
// in the joined error; nil means the enforcer would start on it.
func Check(cfg Config, environ []string) error {
	var errs []error
	getenv := envLookup(environ)
	tokensEnv := cfg.Explain.TokensEnv
	if tokensEnv == "" {
		tokensEnv = "ALLOT_ADMIN_TOKENS"
	}
	if u := command.UnknownEnv(environ, tokensEnv, "ALLOT_COMPAT"); len(u) > 0 {
		errs = append(errs, fmt.Errorf("app: environment: %s set, but the enforcer reads no such variable (enforcer -h lists them)", strings.Join(u, ", ")))
	}
	if f := cfg.Rules.File; f != "" {
		if err := checkRulesFile(f, cfg); err != nil {
			errs = append(errs, err)
		}
	}
	if d := cfg.Rules.Dir; d != "" && cfg.Rules.Format == FormatEnvoy {
		if err := checkEnvoyDir(d, cfg); err != nil {
			errs = append(errs, err)
		}
	}
	for _, t := range []struct {
		field string
		tls   tlsfiles.Client
		used  bool
	}{
		{"store.tls", cfg.Store.TLS, cfg.Store.Kind != "memory"},
		{"etcd.tls", cfg.Etcd.TLS, len(cfg.Etcd.Endpoints) > 0},
		{"balancer.tls", cfg.Balancer.TLS, cfg.Balancer.Enabled},
		{"rules.xds.tls", cfg.Rules.XDS.TLS, cfg.Rules.Format == FormatEnvoy && cfg.Rules.XDS.Server != "" && cfg.Rules.XDS.TLS.Enabled},
	} {
		if !t.used {
			continue
		}
		if _, err := t.tls.Build(); err != nil {
			errs = append(errs, fmt.Errorf("app: %s: %w", t.field, err))
		}
	}
	if _, err := grpcServerTLS(cfg.Listen); err != nil {
		errs = append(errs, err)
	}
	if ec := cfg.Explain; ec.Enabled {
		if _, err := adminauth.Load(ec.TokensFile, tokensEnv, getenv); err != nil {
			errs = append(errs, fmt.Errorf("app: explain: %w", err))
		}
	}
	return errors.Join(errs...)
}

// checkRulesFile loads, validates and compiles the rules file for cfg's region, as the
// file source (rules.file alone) or the etcd source's base (with rules.etcd_prefix) does.
func checkRulesFile(path string, cfg Config) error {
	set, err := loadBase(path)
	if err != nil {
		return err
	}
	opt := rules.CompileOptions{Region: cfg.Region, Regions: cfg.Regions, IPv6Prefix: cfg.Rules.IPv6Prefix}
	if _, err := rules.Compile(set, opt); err != nil {
		return fmt.Errorf("app: rules file: %w", err)
	}
	return nil
}

// checkEnvoyDir loads and compiles a directory of envoyproxy/ratelimit files as the
// enforcer would serve it.
func checkEnvoyDir(dir string, cfg Config) error {
	set, _, err := rules.LoadEnvoyDir(dir, cfg.Rules.MergeDomains)
	if err == nil {
		opt := rules.CompileOptions{Region: cfg.Region, Regions: cfg.Regions, IPv6Prefix: cfg.Rules.IPv6Prefix}
		_, err = rules.Compile(set, opt)
	}
	if err != nil {
		return fmt.Errorf("app: rules.dir: %w", err)
	}
	return nil
}

// envLookup is getenv over environ ("NAME=value" entries; the last one of a name wins).
func envLookup(environ []string) func(string) string {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return func(k string) string { return m[k] }
}
