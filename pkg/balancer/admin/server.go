// Package admin is the balancer's admin API: HTTP JSON under /v1/admin/ to list, read,
// change and delete the rules the enforcers watch in etcd (one rule per key under the
// rules prefix, rules.EtcdSource's format) and per-key overrides, to check a rule file
// without applying it, to read an identity's current shares, to read the audit log and to
// ask every region's enforcers "why was this key limited?".
//
//	GET    /v1/admin/rules              every rule in etcd, and the revision read
//	PUT    /v1/admin/rules              apply a rule file (ApplyRequest): upsert its rules
//	GET    /v1/admin/rules/{id}         one rule
//	PUT    /v1/admin/rules/{id}         write one rule (RuleRequest)
//	DELETE /v1/admin/rules/{id}         delete one rule (?reason=)
//	GET    /v1/admin/overrides          the per-key overrides (rules matching one api_key)
//	GET    /v1/admin/overrides/{key}    one key's override
//	PUT    /v1/admin/overrides/{key}    set it (OverrideRequest: limits, expires_at, reason)
//	DELETE /v1/admin/overrides/{key}    delete it (?reason=)
//	POST   /v1/admin/check              dry run: check a rule file (CheckRequest), write nothing
//	GET    /v1/admin/shares/{key}       an api key's shares (the core's when leading, else etcd's)
//	GET    /v1/admin/audit              the newest audit records (?limit=, default 50)
//	GET    /v1/admin/explain?api_key=…  /v1/explain of every registered enforcer, by region
//
// # Auth
//
// Every route needs "Authorization: Bearer <token>" with one of the configured named tokens
// (pkg/adminauth: file or environment variable, compared in constant time); without one,
// or with a wrong or malformed one, the answer is 401 and nothing is read. Serve it over
// TLS (admin.tls in the balancer config) anywhere but loopback.
//
// # Changes
//
// Every change carries the revision the caller read (If-Match header or "revision"
// field) and a reason. The server reads the rules prefix, applies the change to it, parses
// and compiles the whole resulting set the way every enforcer will (rules.EtcdSet over the
// base file, rules.Compile with the balancer's regions), and writes it in one etcd
// transaction — the rule puts and deletes, the audit record and the change marker — that
// lands only if no key under the rules prefix was written after that revision and no
// admin change landed after it. So nothing partial is ever written, a set that would be
// rejected is refused whole (400, every problem naming key or file, rule, field and line),
// and two admins never overwrite each other blindly: the second gets 409 and reads again.
// The revision is over the whole prefix, not one key, because the set is checked as a
// whole (two rules with one id in different keys are an error of neither alone). Direct
// etcdctl deletes under the prefix are the one change the compare cannot see.
//
// # Audit
//
// Each change writes one AuditRecord (who: the token's name, when, action, rule ids,
// reason, the revision read) under the audit prefix in the change's own transaction. The
// newest Config.AuditKeep (default 1000) are kept: older ones are deleted after each
// change.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
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

// Defaults of Config.
const (
	DefaultRulesPrefix    = "/allot/rules/"
	DefaultAuditPrefix    = "/allot/admin/audit/"
	DefaultChangeKey      = "/allot/admin/changed"
	DefaultRegistryPrefix = "/allot/enforcers/"
	DefaultAuditKeep      = 1000
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
	def(&cfg.RulesPrefix, DefaultRulesPrefix)
	def(&cfg.SharesPrefix, contract.SharesPrefix)
	def(&cfg.AuditPrefix, DefaultAuditPrefix)
	def(&cfg.ChangeKey, DefaultChangeKey)
	def(&cfg.RegistryPrefix, DefaultRegistryPrefix)
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

// ErrorResponse is the body of every error answer.
type ErrorResponse struct {
	Error string `json:"error"`
	// Problems lists each problem of a refused rule set.
	Problems []Problem `json:"problems,omitempty"`
}

// wrap authenticates, runs h and writes its answer (200 with v as JSON) or its error.
func (s *Server) wrap(h func(w http.ResponseWriter, r *http.Request, who string) (any, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who, err := s.cfg.Tokens.Authenticate(r)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="allot-admin"`)
			// The body is never read: closing the connection after the answer keeps net/http
			// from draining it (a slow body would hold the connection until the read timeout).
			w.Header().Set("Connection", "close")
			writeJSON(w, http.StatusUnauthorized, ErrorResponse{Error: err.Error()})
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
		v, err := h(w, r, who)
		if err != nil {
			s.writeError(w, r, who, err)
			return
		}
		if v != nil {
			writeJSON(w, http.StatusOK, v)
		}
	})
}

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, who string, err error) {
	code := http.StatusInternalServerError
	resp := ErrorResponse{Error: err.Error()}
	var inv *InvalidError
	switch {
	case errors.As(err, &inv):
		code, resp.Problems = http.StatusBadRequest, problems(inv.Err)
	case errors.Is(err, ErrBadRequest):
		code = http.StatusBadRequest
	case errors.Is(err, ErrConflict):
		code = http.StatusConflict
	case errors.Is(err, ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		code = http.StatusServiceUnavailable
	}
	if code >= 500 {
		s.cfg.Logger.Warn("admin request failed", "method", r.Method, "path", r.URL.Path, "who", who, "error", err)
	}
	writeJSON(w, code, resp)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

// decode reads one JSON value with unknown fields refused.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: body: %v", ErrBadRequest, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: body: more than one JSON value", ErrBadRequest)
	}
	return nil
}

// revision is the revision a change is compared on: If-Match (a number, quotes allowed)
// or the body's field; both set must agree.
func revision(r *http.Request, body int64) (int64, error) {
	h := strings.Trim(strings.TrimPrefix(r.Header.Get("If-Match"), "W/"), `"`)
	if h == "" {
		h = r.URL.Query().Get("revision")
	}
	if h == "" {
		return body, nil
	}
	n, err := strconv.ParseInt(h, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%w: If-Match/revision %.30q is not a revision (a positive number from a read)", ErrBadRequest, h)
	}
	if body != 0 && body != n {
		return 0, fmt.Errorf("%w: If-Match %d and body revision %d disagree", ErrBadRequest, n, body)
	}
	return n, nil
}

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

// CheckRequest is the body of POST /v1/admin/check: a rule file to check, alone, the way
// `enforcer rules check` does (rules.CheckYAML), with the balancer's regions.
type CheckRequest struct {
	File string `json:"file"`
	YAML string `json:"yaml"`
}

// CheckResponse answers it: OK, or every problem.
type CheckResponse struct {
	OK       bool      `json:"ok"`
	Rules    int       `json:"rules"`
	Error    string    `json:"error,omitempty"`
	Problems []Problem `json:"problems,omitempty"`
}

func (s *Server) check(_ http.ResponseWriter, r *http.Request, _ string) (any, error) {
	var req CheckRequest
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	opt := s.cfg.Compile
	opt.Now = s.cfg.Clock.Now()
	if err := rules.CheckYAML([]byte(req.YAML), req.File, opt); err != nil {
		return CheckResponse{Error: err.Error(), Problems: problems(err)}, nil
	}
	set, _ := rules.ParseYAMLAt([]byte(req.YAML), req.File)
	return CheckResponse{OK: true, Rules: len(set.Rules)}, nil
}

func (s *Server) listAudit(_ http.ResponseWriter, r *http.Request, _ string) (any, error) {
	limit := 50
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > s.cfg.AuditKeep {
			return nil, fmt.Errorf("%w: limit %.20q, want 1-%d", ErrBadRequest, v, s.cfg.AuditKeep)
		}
		limit = n
	}
	recs, err := s.audit(r.Context(), limit)
	if err != nil {
		return nil, err
	}
	return map[string]any{"keep": s.cfg.AuditKeep, "records": recs}, nil
}
