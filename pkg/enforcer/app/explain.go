package app

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/allot-dev/allot/pkg/adminauth"
	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/enforcer/httpapi"
	"github.com/allot-dev/allot/pkg/enforcer/overrides"
)

// The shares table tells explain its set's version and age.
var _ enforcer.ShareStatus = (*overrides.Holder)(nil)

// ExplainConfig: GET /v1/explain on the HTTP address ("why was I limited?"). Off by
// default; on, it needs admin tokens (the balancer's: its `explain` forwards the
// caller's).
type ExplainConfig struct {
	Enabled bool `yaml:"enabled"`
	// TokensFile holds "name:secret" lines; TokensEnv names a variable holding
	// "name:secret,..." (default ALLOT_ADMIN_TOKENS). Both are read.
	TokensFile string `yaml:"tokens_file"`
	TokensEnv  string `yaml:"tokens_env"`
	// Customers lets a caller without an admin token explain its own api key (the
	// forward-auth API key header, set by the gateway): expose /v1/explain to customers
	// only through a gateway that sets that header from the authenticated key.
	Customers bool `yaml:"customers"`
}

// ExplainOff is the body of /v1/explain on an enforcer with explain off: what to turn on.
const ExplainOff = "explain is off on this enforcer: set explain.enabled: true and explain.tokens_file " +
	"(name:secret lines, the balancer's admin tokens) in its config, or -explain and -explain-tokens-file " +
	"(or $ALLOT_ADMIN_TOKENS), and restart it"

// withExplain adds GET /v1/explain in front of h when explain is enabled; when it is not,
// /v1/explain answers 404 with ExplainOff (JSON {"error": ...}, as the balancer's admin
// API answers), so a caller learns what to turn on rather than "404 page not found".
func (a *App) withExplain(h http.Handler) (http.Handler, error) {
	ec := a.cfg.Explain
	mux := http.NewServeMux()
	mux.Handle("/", h)
	if !ec.Enabled {
		mux.HandleFunc("/v1/explain", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": ExplainOff})
		})
		return mux, nil
	}
	env := ec.TokensEnv
	if env == "" {
		env = "ALLOT_ADMIN_TOKENS"
	}
	tokens, err := adminauth.Load(ec.TokensFile, env, nil)
	if err != nil {
		return nil, fmt.Errorf("app: explain: %w", err)
	}
	mux.Handle("GET /v1/explain", httpapi.ExplainHandler(a.node.Enforcer(), httpapi.ExplainConfig{
		Tokens: tokens, Customers: ec.Customers, APIKeyHeader: a.cfg.authConfig().APIKeyHeader}))
	return mux, nil
}
