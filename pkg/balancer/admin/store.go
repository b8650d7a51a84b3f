package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/allot-dev/allot/pkg/rules"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The rules prefix in etcd and a change to it: read takes the prefix whole at one revision;
// apply checks the set a change would leave the way every enforcer will and writes the
// change, with its audit record, in one transaction compared on the revision the caller
// read. Errors of a change name the status they are answered with.

// Errors of a change, each answered with its own status (see the package doc).
var (
	// ErrConflict: something under the rules prefix (or an admin change) landed after the
	// revision the caller read. Read again and retry. 409.
	ErrConflict = errors.New("admin: conflict: the rules changed since the revision you read")
	// ErrBadRequest wraps every malformed request. 400.
	ErrBadRequest = errors.New("admin: bad request")
	// ErrNotFound: no such rule or override. 404.
	ErrNotFound = errors.New("admin: not found")
)

// entry is one rule as stored: its key, its revision and its value.
type entry struct {
	key    string
	modRev int64
	value  []byte
}

// state is the rules prefix read at one revision.
type state struct {
	rev  int64
	kvs  map[string]entry // by key
	byID map[string]string
	bad  map[string]error // keys whose value does not parse
}

func (s *Server) read(ctx context.Context) (*state, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	resp, err := s.cfg.Etcd.Get(ctx, s.cfg.RulesPrefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("admin: while reading %s from etcd: %w", s.cfg.RulesPrefix, err)
	}
	st := &state{rev: resp.Header.Revision, kvs: map[string]entry{}, byID: map[string]string{}, bad: map[string]error{}}
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		st.kvs[k] = entry{key: k, modRev: kv.ModRevision, value: kv.Value}
		r, err := rules.ParseRuleAt(kv.Value, k)
		if err != nil {
			st.bad[k] = err
			continue
		}
		id := r.ID
		if id == "" {
			id = strings.TrimPrefix(strings.TrimPrefix(k, s.cfg.RulesPrefix), "/")
		}
		st.byID[id] = k
	}
	return st, nil
}

// sortedIDs returns the ids of st in order.
func (st *state) sortedIDs() []string {
	ids := make([]string, 0, len(st.byID))
	for id := range st.byID {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// change is one admin change: rules to write (by id) and rule ids to delete.
type change struct {
	action string
	put    []*rules.Rule
	del    []string
	reason string
	rev    int64 // the revision the caller read
	who    string
	dryRun bool
}

// Result is the answer to a change.
type Result struct {
	// Revision is the etcd revision of the change (0 for a dry run or no change).
	Revision int64 `json:"revision"`
	// Changed names the rule ids written or deleted (unchanged rules are not rewritten).
	Changed []string `json:"changed"`
	DryRun  bool     `json:"dry_run,omitempty"`
	// Audit is the key of the audit record.
	Audit string `json:"audit,omitempty"`
}

// apply checks the change against the rules in etcd the way every enforcer will
// (rules.CheckEtcd: each rule alone, then the whole set over the base): a rule it writes
// that an enforcer would refuse, or a bad whole set, refuses it; a bad rule already in etcd
// that it does not write does not. It writes the change in one transaction compared on
// c.rev: it lands only if nothing under the rules prefix and no admin change landed after
// c.rev. The audit record goes in the same transaction. Nothing is written on any error.
func (s *Server) apply(ctx context.Context, c *change) (Result, error) {
	if strings.TrimSpace(c.reason) == "" {
		return Result{}, fmt.Errorf("%w: reason is missing: say why (it is kept in the audit record)", ErrBadRequest)
	}
	if c.rev <= 0 {
		return Result{}, fmt.Errorf("%w: revision is missing: send the revision you read (If-Match header or \"revision\" field; GET /v1/admin/rules says it)", ErrBadRequest)
	}
	st, err := s.read(ctx)
	if err != nil {
		return Result{}, err
	}
	if c.rev > st.rev {
		return Result{}, fmt.Errorf("%w: revision %d is ahead of etcd's %d: send the revision a read returned", ErrBadRequest, c.rev, st.rev)
	}
	next := map[string][]byte{}
	for k, e := range st.kvs {
		next[k] = e.value
	}
	var ops []clientv3.Op
	var changed []string
	for _, id := range c.del {
		k, ok := st.byID[id]
		if !ok { // a value that does not parse has no id: name it by its key
			k = s.cfg.RulesPrefix + id
			_, ok = st.kvs[k]
		}
		if !ok {
			return Result{}, fmt.Errorf("%w: rule %q is not in etcd under %s", ErrNotFound, id, s.cfg.RulesPrefix)
		}
		delete(next, k)
		ops = append(ops, clientv3.OpDelete(k))
		changed = append(changed, id)
	}
	for _, r := range c.put {
		v, err := rules.EncodeRule(r)
		if err != nil {
			return Result{}, fmt.Errorf("%w: rule %q: %v", ErrBadRequest, r.ID, err)
		}
		k, ok := st.byID[r.ID]
		if !ok {
			k = s.cfg.RulesPrefix + r.ID
		}
		if old, ok := next[k]; ok && string(old) == string(v) {
			continue // unchanged: no write, no event on every enforcer
		}
		next[k] = v
		ops = append(ops, clientv3.OpPut(k, string(v)))
		changed = append(changed, r.ID)
	}
	opt := s.cfg.Compile
	opt.Now = s.cfg.Clock.Now()
	refused, err := rules.CheckEtcd(s.cfg.RulesPrefix, next, s.base(), opt)
	if err != nil {
		return Result{}, &InvalidError{Err: err}
	}
	// A key this change writes must not be refused; a bad key it does not touch (written
	// past the admin API) is refused by the enforcers alone and blocks nothing here.
	var bad []error
	for _, op := range ops {
		if k := string(op.KeyBytes()); op.IsPut() && refused[k] != nil {
			bad = append(bad, refused[k])
		}
	}
	if len(bad) > 0 {
		return Result{}, &InvalidError{Err: errors.Join(bad...)}
	}
	res := Result{Changed: changed, DryRun: c.dryRun}
	if c.dryRun || len(ops) == 0 {
		return res, nil
	}
	if len(ops)+2 > s.cfg.MaxTxnOps {
		return Result{}, fmt.Errorf("%w: %d rules change, but one etcd transaction takes at most %d operations (etcd --max-txn-ops, admin.max_txn_ops): raise both or change fewer rules at once", ErrBadRequest, len(ops), s.cfg.MaxTxnOps-2)
	}
	now := s.cfg.Clock.Now().UTC()
	rec := AuditRecord{At: now, Who: c.who, Action: c.action, Rules: changed, Reason: c.reason, ReadRevision: c.rev}
	recJSON, _ := json.Marshal(rec)
	auditKey := s.auditKey(now)
	ops = append(ops, clientv3.OpPut(auditKey, string(recJSON)), clientv3.OpPut(s.cfg.ChangeKey, auditKey))
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(s.cfg.RulesPrefix), "<", c.rev+1).WithPrefix(),
		clientv3.Compare(clientv3.ModRevision(s.cfg.ChangeKey), "<", c.rev+1),
	}
	tctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	resp, err := s.cfg.Etcd.Txn(tctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return Result{}, fmt.Errorf("admin: while writing to etcd (nothing was written unless a read shows it): %w", err)
	}
	if !resp.Succeeded {
		return Result{}, fmt.Errorf("%w (read at %d); read again and retry", ErrConflict, c.rev)
	}
	res.Revision, res.Audit = resp.Header.Revision, auditKey
	s.pruneAudit(ctx)
	return res, nil
}

// InvalidError is a change refused because the resulting rule set is invalid: Err is the
// rules package's error (every problem, each naming the key or file, rule, field and
// line). 400.
type InvalidError struct{ Err error }

func (e *InvalidError) Error() string { return e.Err.Error() }
func (e *InvalidError) Unwrap() error { return e.Err }

// Problem is one rules.Error as JSON.
type Problem struct {
	Message string `json:"message"`
	File    string `json:"file,omitempty"`
	Line    int    `json:"line,omitempty"`
	Rule    string `json:"rule,omitempty"`
	Field   string `json:"field,omitempty"`
}

// problems flattens a rules error into its problems, in order.
func problems(err error) []Problem {
	var out []Problem
	var walk func(error)
	walk = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		p := Problem{Message: err.Error()}
		var re *rules.Error
		if errors.As(err, &re) {
			p.File, p.Line, p.Rule, p.Field = re.File, re.Line, re.Rule, re.Field
		}
		out = append(out, p)
	}
	walk(err)
	return out
}
