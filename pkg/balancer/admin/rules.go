package admin

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/allot-dev/allot/pkg/rules"
)

// The rules: list what etcd holds, read one rule, apply a rule file, write or delete one
// rule. Every change goes through apply (store.go).

// RuleEntry is one rule in etcd.
type RuleEntry struct {
	ID          string          `json:"id"`
	Key         string          `json:"key"`
	ModRevision int64           `json:"mod_revision"`
	Rule        json.RawMessage `json:"rule,omitempty"`
	// Error is set instead of Rule for a value that does not parse (the enforcers refuse
	// that rule alone until it is fixed or deleted; see rules.EtcdSource).
	Error string `json:"error,omitempty"`
}

// RulesResponse answers GET /v1/admin/rules and /v1/admin/overrides.
type RulesResponse struct {
	// Revision is the etcd revision read: send it back with a change.
	Revision int64       `json:"revision"`
	Rules    []RuleEntry `json:"rules"`
}

func (s *Server) entries(st *state, keep func(*rules.Rule) bool) []RuleEntry {
	out := []RuleEntry{}
	for _, id := range st.sortedIDs() {
		k := st.byID[id]
		e := st.kvs[k]
		r, _ := rules.ParseRuleAt(e.value, k)
		if r.ID == "" {
			r.ID = id
		}
		if keep != nil && !keep(r) {
			continue
		}
		v, _ := rules.EncodeRule(r)
		out = append(out, RuleEntry{ID: id, Key: k, ModRevision: e.modRev, Rule: v})
	}
	if keep == nil {
		for k, err := range st.bad {
			out = append(out, RuleEntry{Key: k, ModRevision: st.kvs[k].modRev, Error: err.Error()})
		}
	}
	return out
}

func (s *Server) listRules(w http.ResponseWriter, r *http.Request, _ string) (any, error) {
	st, err := s.read(r.Context())
	if err != nil {
		return nil, err
	}
	w.Header().Set("ETag", strconv.FormatInt(st.rev, 10))
	return RulesResponse{Revision: st.rev, Rules: s.entries(st, nil)}, nil
}

// RuleResponse answers GET of one rule or override.
type RuleResponse struct {
	Revision int64 `json:"revision"`
	RuleEntry
}

func (s *Server) getOne(w http.ResponseWriter, r *http.Request, id string) (any, error) {
	st, err := s.read(r.Context())
	if err != nil {
		return nil, err
	}
	k, ok := st.byID[id]
	if !ok {
		return nil, fmt.Errorf("%w: rule %q is not in etcd under %s", ErrNotFound, id, s.cfg.RulesPrefix)
	}
	w.Header().Set("ETag", strconv.FormatInt(st.rev, 10))
	for _, e := range s.entries(st, func(x *rules.Rule) bool { return x.ID == id }) {
		if e.Key == k {
			return RuleResponse{Revision: st.rev, RuleEntry: e}, nil
		}
	}
	return nil, fmt.Errorf("%w: rule %q", ErrNotFound, id)
}

func (s *Server) getRule(w http.ResponseWriter, r *http.Request, _ string) (any, error) {
	return s.getOne(w, r, r.PathValue("id"))
}

// ApplyRequest is the body of PUT /v1/admin/rules: a rule file (YAML or JSON, the schema
// of configs/rules) whose rules are written to etcd (added or replaced by id; rules not in
// the file are left alone), checked as a whole over what etcd holds. The file's version:
// is not stored: rules from etcd are named by their content hash.
type ApplyRequest struct {
	Revision int64  `json:"revision"`
	Reason   string `json:"reason"`
	// File names the file in errors ("rules.yaml:14: rule ...").
	File   string `json:"file"`
	YAML   string `json:"yaml"`
	DryRun bool   `json:"dry_run"`
}

func (s *Server) applyRules(_ http.ResponseWriter, r *http.Request, who string) (any, error) {
	var req ApplyRequest
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	rev, err := revision(r, req.Revision)
	if err != nil {
		return nil, err
	}
	if req.File == "" {
		req.File = "request"
	}
	set, err := rules.ParseYAMLAt([]byte(req.YAML), req.File)
	if err != nil {
		return nil, &InvalidError{Err: err}
	}
	// The file alone first: its errors then name its lines, as `enforcer rules check`.
	if err := set.Validate(); err != nil {
		return nil, &InvalidError{Err: err}
	}
	c := &change{action: "rules.apply", reason: req.Reason, rev: rev, who: who, dryRun: req.DryRun}
	for i := range set.Rules {
		c.put = append(c.put, &set.Rules[i])
	}
	return s.apply(r.Context(), c)
}

// RuleRequest is the body of PUT /v1/admin/rules/{id}: one rule in the rule schema (its id,
// if set, must be the path's).
type RuleRequest struct {
	Revision int64           `json:"revision"`
	Reason   string          `json:"reason"`
	Rule     json.RawMessage `json:"rule"`
	DryRun   bool            `json:"dry_run"`
}

func (s *Server) putRule(_ http.ResponseWriter, r *http.Request, who string) (any, error) {
	id := r.PathValue("id")
	var req RuleRequest
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	rev, err := revision(r, req.Revision)
	if err != nil {
		return nil, err
	}
	if len(req.Rule) == 0 {
		return nil, fmt.Errorf("%w: rule is missing", ErrBadRequest)
	}
	rule, err := rules.ParseRuleAt(req.Rule, "rule "+id)
	if err != nil {
		return nil, &InvalidError{Err: err}
	}
	switch {
	case rule.ID == "":
		rule.ID = id
	case rule.ID != id:
		return nil, fmt.Errorf("%w: the rule's id %q is not the path's %q", ErrBadRequest, rule.ID, id)
	}
	return s.apply(r.Context(), &change{action: "rule.put", put: []*rules.Rule{rule}, reason: req.Reason, rev: rev, who: who, dryRun: req.DryRun})
}

func (s *Server) deleteRule(_ http.ResponseWriter, r *http.Request, who string) (any, error) {
	rev, err := revision(r, 0)
	if err != nil {
		return nil, err
	}
	return s.apply(r.Context(), &change{action: "rule.delete", del: []string{r.PathValue("id")}, reason: r.URL.Query().Get("reason"), rev: rev, who: who})
}
