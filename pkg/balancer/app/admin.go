package app

import (
	"encoding/json"
	"fmt"
	"github.com/allot-dev/allot/pkg/contract"
	"net/http"
	"time"

	"github.com/allot-dev/allot/pkg/adminauth"
	"github.com/allot-dev/allot/pkg/balancer"
	"github.com/allot-dev/allot/pkg/balancer/admin"
	"github.com/allot-dev/allot/pkg/rules"
)

// AdminConfig: the admin API (pkg/balancer/admin) on the HTTP listener. Off by default;
// when on it needs rules.etcd_prefix (the rules it changes) and at least one token.
type AdminConfig struct {
	Enabled bool `yaml:"enabled"`
	// TokensFile holds "name:secret" lines; TokensEnv names an environment variable
	// holding "name:secret,..." (default ALLOT_ADMIN_TOKENS). Both are read.
	TokensFile string `yaml:"tokens_file"`
	TokensEnv  string `yaml:"tokens_env"`
	// TLS serves the HTTP listener (admin API, metrics, health) over TLS.
	TLS ServerTLSConfig `yaml:"tls"`
	// AuditKeep is how many audit records are kept (the newest). Default 1000.
	AuditKeep int `yaml:"audit_keep"`
	// MaxTxnOps is the etcd cluster's --max-txn-ops. Default 128.
	MaxTxnOps int `yaml:"max_txn_ops"`
	// RegistryPrefix is where enforcers register (explain asks them). Default
	// /allot/enforcers/.
	RegistryPrefix string `yaml:"registry_prefix"`
	// ExplainScheme is how the enforcers' HTTP APIs are reached: http or https.
	ExplainScheme string `yaml:"explain_scheme"`
}

func defaultAdminConfig() AdminConfig {
	return AdminConfig{TokensEnv: "ALLOT_ADMIN_TOKENS", AuditKeep: admin.DefaultAuditKeep, MaxTxnOps: admin.DefaultMaxTxnOps,
		RegistryPrefix: contract.EnforcersPrefix, ExplainScheme: "http"}
}

func (ac AdminConfig) validate(c *Config) []error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("app: config: admin."+format, a...)) }
	if !ac.Enabled {
		return nil
	}
	if c.Rules.EtcdPrefix == "" {
		bad("enabled needs rules.etcd_prefix: the admin API changes the rules in etcd")
	}
	if c.Listen.HTTP == "" {
		bad("enabled needs listen.http: the admin API is served there")
	}
	if ac.TokensFile == "" && ac.TokensEnv == "" {
		bad("enabled needs tokens_file or tokens_env")
	}
	if ac.AuditKeep <= 0 {
		bad("audit_keep %d, must be > 0", ac.AuditKeep)
	}
	if ac.MaxTxnOps < 3 {
		bad("max_txn_ops %d, must be >= 3", ac.MaxTxnOps)
	}
	if ac.ExplainScheme != "http" && ac.ExplainScheme != "https" {
		bad("explain_scheme %q, want http or https", ac.ExplainScheme)
	}
	if t := ac.TLS; t.Enabled && (t.CertFile == "" || t.KeyFile == "") {
		bad("tls.enabled needs cert_file and key_file")
	}
	return errs
}

// AdminOff is the error /v1/admin/ answers (404) on a balancer with the admin API off:
// what to turn on, so the CLI can say it rather than "404 page not found".
const AdminOff = "the admin API is off on this balancer: start it with admin.enabled: true and " +
	"admin.tokens_file (name:secret lines) in its config, or -admin -admin-tokens-file FILE " +
	"(or $ALLOT_ADMIN_TOKENS=name:secret); it also needs rules.etcd_prefix"

// buildAdmin registers the admin API on the HTTP mux and, with admin.tls, puts TLS on the
// HTTP listener. With the admin API off, /v1/admin/ answers 404 with AdminOff.
func (a *App) buildAdmin() error {
	ac := a.cfg.Admin
	if !ac.Enabled {
		a.mux.HandleFunc("/v1/admin/", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(admin.ErrorResponse{Error: AdminOff})
		})
		return nil
	}
	tokens, err := adminauth.Load(ac.TokensFile, ac.TokensEnv, nil)
	if err != nil {
		return fmt.Errorf("app: admin: %w", err)
	}
	opt, err := balancer.CompileOptionsFor(a.cfg.Regions, a.cfg.weights(), rules.CompileOptions{IPv6Prefix: a.cfg.Rules.IPv6Prefix})
	if err != nil {
		return err
	}
	base := a.base
	srv, err := admin.New(admin.Config{
		Etcd: a.etcd, Tokens: tokens, Rules: a.rules, Leader: a.svc,
		RulesPrefix: a.cfg.Rules.EtcdPrefix, SharesPrefix: a.cfg.Etcd.SharesPrefix,
		AuditKeep: ac.AuditKeep, MaxTxnOps: ac.MaxTxnOps, Compile: opt,
		Base:           func() *rules.Set { return base },
		RegistryPrefix: ac.RegistryPrefix, ExplainScheme: ac.ExplainScheme,
		ExplainClient: &http.Client{Timeout: 3 * time.Second},
		Timeout:       a.cfg.Etcd.WriteTimeout, Logger: a.log.Named("admin"),
	})
	if err != nil {
		return err
	}
	srv.Register(a.mux)
	tc, err := ac.TLS.Build()
	if err != nil {
		return fmt.Errorf("app: admin.tls: %w", err)
	}
	a.srv.HTTPOverTLS(tc)
	a.log.Info("admin API on", "http", a.HTTPAddr(), "tls", tc != nil, "tokens", tokens.Len())
	return nil
}
