package app

import (
	"errors"
	"fmt"
	"strings"

	"github.com/allot-dev/allot/pkg/adminauth"
	"github.com/allot-dev/allot/pkg/balancer"
	"github.com/allot-dev/allot/pkg/rules"
)

// Check is `balancer -check-config`: what New would refuse at start that can be known
// without the network, for a configuration Parse already validated. It reads every file
// the configuration names — the rules file, loaded and compiled with the regions' weights
// as New compiles it; the PEM files of listen.tls (the report API's mutual TLS), etcd.tls
// and admin.tls; the admin and dashboard tokens — and refuses any ALLOT_* variable in
// environ ("NAME=value" entries, os.Environ's form) that the balancer does not read, so a
// misspelt variable cannot pass for a setting. It dials nothing and binds nothing. Every
// problem is named in the joined error; nil means the replica would start on it.
func Check(cfg Config, environ []string) error {
	var errs []error
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	getenv := func(k string) string { return m[k] }
	var also []string
	for _, n := range []string{cfg.Admin.TokensEnv, cfg.Dashboard.TokensEnv} {
		if n != "" {
			also = append(also, n)
		}
	}
	if u := command.UnknownEnv(environ, also...); len(u) > 0 {
		errs = append(errs, fmt.Errorf("app: environment: %s set, but the balancer reads no such variable (balancer -h lists them)", strings.Join(u, ", ")))
	}
	if f := cfg.Rules.File; f != "" {
		opt, err := balancer.CompileOptionsFor(cfg.Regions, cfg.weights(), rules.CompileOptions{IPv6Prefix: cfg.Rules.IPv6Prefix})
		if err == nil {
			var set *rules.Set
			if set, err = rules.LoadFile(f); err == nil {
				if err = set.Validate(); err == nil {
					_, err = rules.Compile(set, opt)
				}
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("app: rules file: %w", err))
		}
	}
	if _, err := cfg.Listen.TLS.Build(); err != nil {
		errs = append(errs, fmt.Errorf("app: listen.tls (the report API's certificates): %w; %s", err, certsHint))
	}
	if _, err := cfg.Etcd.TLS.Build(); err != nil {
		errs = append(errs, fmt.Errorf("app: etcd.tls: %w", err))
	}
	if ac := cfg.Admin; ac.Enabled {
		if _, err := adminauth.Load(ac.TokensFile, ac.TokensEnv, getenv); err != nil {
			errs = append(errs, fmt.Errorf("app: admin: %w", err))
		}
		if _, err := ac.TLS.Build(); err != nil {
			errs = append(errs, fmt.Errorf("app: admin.tls: %w", err))
		}
	}
	if dc := cfg.Dashboard; dc.TokensFile != "" {
		if _, err := adminauth.Load(dc.TokensFile, dc.TokensEnv, getenv); err != nil {
			errs = append(errs, fmt.Errorf("app: dashboard.tokens_file: %w", err))
		}
	} else if v := strings.TrimSpace(getenv(dc.TokensEnv)); dc.TokensEnv != "" && v != "" {
		if _, err := adminauth.Parse(v); err != nil {
			errs = append(errs, fmt.Errorf("app: dashboard: $%s: %w", dc.TokensEnv, err))
		}
	}
	return errors.Join(errs...)
}
