package admin

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/allot-dev/allot/pkg/adminauth"
	"github.com/allot-dev/allot/pkg/balancer"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The Server: its Config, New, and Register, which lists every route of the API. The
// routes: rules.go, overrides.go, check.go, shares.go, audit.go, explain.go; how each one
// is served: handler.go; a change to etcd: store.go.

// Defaults of Config.
const (
	DefaultAuditKeep = 1000
	// DefaultMaxTxnOps is etcd's default --max-txn-ops.
	DefaultMaxTxnOps = 128
	// MaxBodyBytes bounds a request body.
	MaxBodyBytes = 8 << 20
)

// Leader is what the admin API needs of the balancer service (balancer.Service).
type Leader interface {
	LeaderIdentity(rule, identity string) (st balancer.IdentityState, tracked, leading bool)
	Regions() []string
}

// Config configures a Server. Etcd, Tokens, Rules and Leader are required.
type Config struct {
	Etcd   *clientv3.Client
	Tokens *adminauth.Tokens
	// Rules serves the balancer's rules snapshot (the one shares are computed from).
	Rules *rules.Holder
	// Leader answers the shares of an identity while this replica leads.
	Leader Leader
	// RulesPrefix is the prefix the enforcers watch (one rule per key). It must not hold
	// the audit prefix or change key: every key under it is read as a rule.
	RulesPrefix string
	// SharesPrefix is where share sets are published (read when standing by).
	SharesPrefix string
	// AuditPrefix and ChangeKey hold the audit records and the last change's marker.
	AuditPrefix string
	ChangeKey   string
	// AuditKeep is how many audit records are kept (the newest); > 0.
	AuditKeep int
	// MaxTxnOps is etcd's --max-txn-ops: a change of more rules than fit is refused.
	MaxTxnOps int
	// Base is the base rule set the enforcers layer etcd over (their rules file), nil
	// when none; changes are checked over it.
	Base func() *rules.Set
	// Compile are the options the set is checked with (the balancer's regions).
	Compile rules.CompileOptions
	// RegistryPrefix is where enforcers register (their /v1/explain addresses).
	RegistryPrefix string
	// ExplainScheme is "http" or "https" for the enforcers' HTTP APIs; ExplainClient
	// asks them (default: a client with a 3 s timeout).
	ExplainScheme string
	ExplainClient *http.Client
	// Timeout bounds each etcd call. Default 5s.
	Timeout time.Duration
	Clock   clock.Clock
	Logger  hclog.Logger
}

// Server serves the admin API. Safe for concurrent use; it owns no goroutines.
type Server struct {
	cfg Config
}

// New checks cfg, fills defaults and returns a Server.
func New(cfg Config) (*Server, error) {
	switch {
	case cfg.Etcd == nil:
		return nil, errors.New("admin: Config.Etcd is nil")
	case cfg.Tokens.Len() == 0:
		return nil, errors.New("admin: Config.Tokens holds no token: the admin API is never served open")
	case cfg.Rules == nil:
		return nil, errors.New("admin: Config.Rules is nil")
	case cfg.Leader == nil:
		return nil, errors.New("admin: Config.Leader is nil")
	case cfg.AuditKeep < 0:
		return nil, fmt.Errorf("admin: Config.AuditKeep %d, must be > 0", cfg.AuditKeep)
	case cfg.MaxTxnOps < 0 || (cfg.MaxTxnOps > 0 && cfg.MaxTxnOps < 3):
		return nil, fmt.Errorf("admin: Config.MaxTxnOps %d, must be >= 3", cfg.MaxTxnOps)
	}
	def := func(v *string, d string) {
		if *v == "" {
			*v = d
		}
	}
	def(&cfg.RulesPrefix, contract.RulesPrefix)
	def(&cfg.SharesPrefix, contract.SharesPrefix)
	def(&cfg.AuditPrefix, contract.AuditPrefix)
	def(&cfg.ChangeKey, contract.ChangeKey)
	def(&cfg.RegistryPrefix, contract.EnforcersPrefix)
	def(&cfg.ExplainScheme, "http")
	if strings.HasPrefix(cfg.AuditPrefix, cfg.RulesPrefix) || strings.HasPrefix(cfg.ChangeKey, cfg.RulesPrefix) {
		return nil, fmt.Errorf("admin: audit prefix %q and change key %q must be outside the rules prefix %q", cfg.AuditPrefix, cfg.ChangeKey, cfg.RulesPrefix)
	}
	if cfg.AuditKeep == 0 {
		cfg.AuditKeep = DefaultAuditKeep
	}
	if cfg.MaxTxnOps == 0 {
		cfg.MaxTxnOps = DefaultMaxTxnOps
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.ExplainClient == nil {
		cfg.ExplainClient = &http.Client{Timeout: 3 * time.Second}
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real()
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	return &Server{cfg: cfg}, nil
}

func (s *Server) base() *rules.Set {
	if s.cfg.Base == nil {
		return nil
	}
	return s.cfg.Base()
}

// Register adds the routes to mux (the balancer's HTTP server).
func (s *Server) Register(mux *http.ServeMux) {
	for _, r := range []struct {
		pattern string
		h       func(w http.ResponseWriter, r *http.Request, who string) (any, error)
	}{
		{"GET /v1/admin/rules", s.listRules},
		{"PUT /v1/admin/rules", s.applyRules},
		{"GET /v1/admin/rules/{id}", s.getRule},
		{"PUT /v1/admin/rules/{id}", s.putRule},
		{"DELETE /v1/admin/rules/{id}", s.deleteRule},
		{"GET /v1/admin/overrides", s.listOverrides},
		{"GET /v1/admin/overrides/{key}", s.getOverride},
		{"PUT /v1/admin/overrides/{key}", s.putOverride},
		{"DELETE /v1/admin/overrides/{key}", s.deleteOverride},
		{"POST /v1/admin/check", s.check},
		{"GET /v1/admin/shares/{key}", s.shares},
		{"GET /v1/admin/audit", s.listAudit},
		{"GET /v1/admin/explain", s.explain},
	} {
		mux.Handle(r.pattern, s.wrap(r.h))
	}
	mux.Handle("/v1/admin/", s.wrap(func(w http.ResponseWriter, r *http.Request, _ string) (any, error) {
		return nil, fmt.Errorf("%w: no route %s %s (see pkg/balancer/admin)", ErrNotFound, r.Method, r.URL.Path)
	}))
}
