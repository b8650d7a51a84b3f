package admin

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/allot-dev/allot/pkg/rules"
)

// The per-key overrides: a rule matching one api key alone, its id OverrideID(key), with
// the key's own limits until it expires. Listed, read, set and deleted like the rules
// (rules.go), through apply (store.go).

func isOverride(r *rules.Rule) bool {
	m := r.Match
	return m.APIKey != "" && m.Plan == "" && m.Org == "" && m.Endpoint == "" && m.IP == ""
}

func (s *Server) listOverrides(w http.ResponseWriter, r *http.Request, _ string) (any, error) {
	st, err := s.read(r.Context())
	if err != nil {
		return nil, err
	}
	w.Header().Set("ETag", strconv.FormatInt(st.rev, 10))
	return RulesResponse{Revision: st.rev, Rules: s.entries(st, isOverride)}, nil
}

func (s *Server) getOverride(w http.ResponseWriter, r *http.Request, _ string) (any, error) {
	return s.getOne(w, r, OverrideID(r.PathValue("key")))
}

// LimitJSON is one limit as the rule schema writes it.
type LimitJSON struct {
	Name  string  `json:"name"`
	Rate  float64 `json:"rate"`
	Per   string  `json:"per"`
	Burst float64 `json:"burst,omitempty"`
}

// OverrideRequest is the body of PUT /v1/admin/overrides/{key}: the key's own limits until
// ExpiresAt (RFC 3339, required, in the future), with a reason (required). It is stored as
// the rule OverrideID(key) matching api_key = key, which beats every rule that does not
// name the key (rules.Match.Specificity).
type OverrideRequest struct {
	Revision  int64       `json:"revision"`
	Reason    string      `json:"reason"`
	ExpiresAt string      `json:"expires_at"`
	Limits    []LimitJSON `json:"limits"`
	By        string      `json:"by,omitempty"`
	FailMode  string      `json:"fail_mode,omitempty"`
	DryRun    bool        `json:"dry_run"`
}

func (s *Server) putOverride(_ http.ResponseWriter, r *http.Request, who string) (any, error) {
	key := r.PathValue("key")
	var req OverrideRequest
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	rev, err := revision(r, req.Revision)
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(req.Reason) == "" {
		return nil, fmt.Errorf("%w: reason is missing: an override must say why", ErrBadRequest)
	}
	id := OverrideID(key)
	body, _ := json.Marshal(map[string]any{
		"id": id, "match": map[string]string{"api_key": key}, "limits": req.Limits,
		"expires_at": req.ExpiresAt, "reason": req.Reason, "by": req.By, "fail_mode": req.FailMode,
	})
	rule, err := rules.ParseRuleAt(body, "override "+key)
	if err != nil {
		return nil, &InvalidError{Err: err}
	}
	// The validator says a missing expires_at is an error; a past one would be a no-op.
	if !rule.ExpiresAt.IsZero() && !rule.ExpiresAt.After(s.cfg.Clock.Now()) {
		return nil, &InvalidError{Err: &rules.Error{File: "override " + key, Rule: id, Field: "expires_at",
			Msg: fmt.Sprintf("%s is in the past: the override would never apply", req.ExpiresAt), Index: 0}}
	}
	return s.apply(r.Context(), &change{action: "override.set", put: []*rules.Rule{rule}, reason: req.Reason, rev: rev, who: who, dryRun: req.DryRun})
}

func (s *Server) deleteOverride(_ http.ResponseWriter, r *http.Request, who string) (any, error) {
	rev, err := revision(r, 0)
	if err != nil {
		return nil, err
	}
	return s.apply(r.Context(), &change{action: "override.delete", del: []string{OverrideID(r.PathValue("key"))}, reason: r.URL.Query().Get("reason"), rev: rev, who: who})
}

var overrideIDRE = regexp.MustCompile(`^[A-Za-z0-9._:@-]{1,70}$`)

// OverrideID is the rule id of the override of api key: "override:<key>", or
// "override:sha256-<16 hex>" for a key a rule id cannot spell.
func OverrideID(key string) string {
	if overrideIDRE.MatchString(key) {
		return "override:" + key
	}
	sum := sha256.Sum256([]byte(key))
	return "override:sha256-" + hex.EncodeToString(sum[:8])
}
