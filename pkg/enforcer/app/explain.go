package app

import (
	"fmt"
	"net/http"

	"github.com/allot-dev/allot/pkg/adminauth"
	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/enforcer/httpapi"
	"github.com/allot-dev/allot/pkg/shares"
)

// The shares table tells explain its set's version and age.
var _ enforcer.ShareStatus = (*shares.Holder)(nil)

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

// withExplain adds GET /v1/explain in front of h when explain is enabled.
func (a *App) withExplain(h http.Handler) (http.Handler, error) {
	ec := a.cfg.Explain
	if !ec.Enabled {
		return h, nil
	}
	env := ec.TokensEnv
	if env == "" {
		env = "ALLOT_ADMIN_TOKENS"
	}
	tokens, err := adminauth.Load(ec.TokensFile, env, nil)
	if err != nil {
		return nil, fmt.Errorf("app: explain: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/", h)
	mux.Handle("GET /v1/explain", httpapi.ExplainHandler(a.enf, httpapi.ExplainConfig{
		Tokens: tokens, Customers: ec.Customers, APIKeyHeader: a.cfg.authConfig().APIKeyHeader}))
	return mux, nil
}
