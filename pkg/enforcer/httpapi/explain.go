package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"

	"github.com/allot-dev/allot/pkg/adminauth"
	"github.com/allot-dev/allot/pkg/enforcer"
)

// ExplainConfig says who may ask GET /v1/explain.
type ExplainConfig struct {
	// Tokens are the admin tokens: a request with one (Authorization: Bearer) may explain
	// any attributes and sees every bucket.
	Tokens *adminauth.Tokens
	// Customers lets a request without an admin token explain its own api key: the key
	// is the one in APIKeyHeader (set by the gateway in front, after it authenticated the
	// caller), the api_key parameter may only repeat it, and only the buckets counted by
	// that key are shown in full (see enforcer.RuleExplain.Redacted). Off: 401 without
	// an admin token.
	Customers bool
	// APIKeyHeader carries the caller's own key. Default "X-Api-Key".
	APIKeyHeader string
}

// ExplainHandler serves GET /v1/explain?api_key=&plan=&org=&endpoint=&ip=&hits= (the
// fields of POST /v1/check as query parameters): the enforcer.Explanation of that
// request, as JSON. Who may ask what is ExplainConfig's: an admin token sees any key, a
// customer (with Customers on) only their own; anything else is 401, a malformed query
// 400. Explaining takes no tokens.
func ExplainHandler(e *enforcer.Enforcer, cfg ExplainConfig) http.Handler {
	if cfg.APIKeyHeader == "" {
		cfg.APIKeyHeader = DefaultConfig().APIKeyHeader
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		admin := false
		if tok, present, err := adminauth.Bearer(r); err != nil {
			writeExplainError(w, http.StatusUnauthorized, err)
			return
		} else if present {
			if _, err := cfg.Tokens.Check(tok); err != nil {
				writeExplainError(w, http.StatusUnauthorized, err)
				return
			}
			admin = true
		}
		req, err := explainRequest(r.URL.Query())
		if err == nil {
			err = e.Validate(&req)
		}
		if err != nil {
			writeExplainError(w, http.StatusBadRequest, err)
			return
		}
		if !admin {
			own := r.Header.Get(cfg.APIKeyHeader)
			switch {
			case !cfg.Customers:
				writeExplainError(w, http.StatusUnauthorized, fmt.Errorf("%w: explain needs an admin token (Authorization: Bearer)", adminauth.ErrUnauthenticated))
				return
			case own == "":
				writeExplainError(w, http.StatusUnauthorized, fmt.Errorf("%w: no admin token and no %s: explain shows a caller its own key only", adminauth.ErrUnauthenticated, cfg.APIKeyHeader))
				return
			case req.Attrs.APIKey != "" && req.Attrs.APIKey != own:
				writeExplainError(w, http.StatusForbidden, errors.New("api_key is not the caller's own: a customer may explain only their own key"))
				return
			}
			req.Attrs.APIKey = own
		}
		x, err := e.Explain(r.Context(), &req, admin)
		if err != nil {
			writeExplainError(w, http.StatusBadRequest, err)
			return
		}
		writeJSON(w, http.StatusOK, x)
	})
}

func writeExplainError(w http.ResponseWriter, code int, err error) {
	if code == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="allot-explain"`)
	}
	writeJSON(w, code, ErrorResponse{Error: err.Error()})
}

// explainRequest reads a check from query parameters; unknown parameters are an error.
// Errors wrap enforcer.ErrInvalid.
func explainRequest(q url.Values) (enforcer.Request, error) {
	var r enforcer.Request
	for k, v := range q {
		if len(v) != 1 {
			return r, fmt.Errorf("%w: parameter %.40q given %d times", enforcer.ErrInvalid, k, len(v))
		}
		switch val := v[0]; k {
		case "api_key":
			r.Attrs.APIKey = val
		case "plan":
			r.Attrs.Plan = val
		case "org":
			r.Attrs.Org = val
		case "endpoint":
			r.Attrs.Endpoint = val
		case "ip":
			ip, err := netip.ParseAddr(val)
			if err != nil {
				return r, fmt.Errorf("%w: ip %.64q is not an IP address", enforcer.ErrInvalid, val)
			}
			r.Attrs.IP = ip.Unmap()
		case "hits":
			n, err := strconv.ParseInt(val, 10, 64)
			if err != nil {
				return r, fmt.Errorf("%w: hits %.32q is not a whole number", enforcer.ErrInvalid, val)
			}
			r.Hits = n
		default:
			return r, fmt.Errorf("%w: unknown parameter %.40q (want api_key, plan, org, endpoint, ip, hits)", enforcer.ErrInvalid, k)
		}
	}
	return r, nil
}
