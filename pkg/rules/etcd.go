package rules

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/allot-dev/allot/pkg/etcdwatch"
	"github.com/allot-dev/allot/pkg/routine"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// EtcdSource keeps a Holder in step with the rules stored under an etcd prefix: each key
// under the prefix holds one rule as a YAML or JSON mapping (the fields of one entry of a
// rule file's `rules:`); a rule without an id takes the key's name after the prefix.
//
// It lists the prefix, then watches it from the next revision, and rebuilds the snapshot
// from the whole prefix on every change, so a snapshot always reflects one etcd revision.
// On a compacted watch or any watch failure it lists again and watches anew, retrying with
// backoff (on the source's clock) while etcd is unreachable; meanwhile the Holder keeps
// serving the last good snapshot. While watching it probes etcd every interval, so Status
// shows an outage even when the client is quietly reconnecting.
//
// A bad rule is refused alone: each key's rule is checked by itself (parsed, validated
// and compiled as a set of one, as Compile would), and a key whose rule fails — or
// repeats the id of a key before it in key order — keeps the last good version this
// source saw under that key (one started after the bad write reads it from etcd's
// history, up to maxLookBack versions back, unless compacted away), or is left out if it
// never had one. The other keys' rules apply as usual, so one broken key does not hold
// every later change hostage. Each refusal (naming the key, rule, field and line) is
// logged once per revision of the key and passed to OnError, and Status().Refused lists
// the keys refused now (the enforcer's /readyz and its allot_rules_refused gauge show
// them); Status().Failures counts rejected sets and etcd errors, not refused rules. Only
// an error of the combined set (more than MaxRules) rejects the whole new set: the
// previous snapshot then stays until a later change makes it good again.
//
// With WithBase the snapshot is the base set with etcd rules layered over it: an etcd
// rule replaces the base (file) rule of the same id wherever that rule sat, and the other
// etcd rules are added after the base's. A replacement is legitimate (an operator moving a
// file rule into etcd) but easy to do by accident, so each one is logged at warn, once per
// revision of the key.
//
// The snapshot's Version is the content hash, so enforcers that hold the same rules report
// the same version however they got there. Safe for concurrent use. The zero value is not
// usable: call NewEtcdSource.
type EtcdSource struct {
	mu      sync.Mutex            // mu guards kvs, rev, lastVer, cfg.base
	kvs     map[string]*etcdEntry // nil until the first list
	rev     int64                 // the revision kvs reflects
	lastVer string

	loop   routine.Routine // Run's
	lw     *etcdwatch.Loop
	cli    *clientv3.Client
	prefix string
	h      *Holder
	opt    CompileOptions
	cfg    sourceConfig
	st     status
}

type etcdEntry struct {
	modRev int64
	rule   *Rule
	err    error // rule failed to parse, validate or compile alone
	// good is the rule to apply: rule when err is nil, else the last good rule seen under
	// the key (nil if none).
	good *Rule
	// refusedLogged, shadowLogged: this revision's refusal / shadowing was announced.
	refusedLogged, shadowLogged bool
}

// NewEtcdSource returns a source for the rules under prefix. It does no I/O: call Load to
// fetch the rules once (e.g. at start, with a deadline) and Run to keep watching. It fails
// only on bad arguments or an invalid base set.
func NewEtcdSource(cli *clientv3.Client, prefix string, h *Holder, opt CompileOptions, opts ...Option) (*EtcdSource, error) {
	switch {
	case cli == nil:
		return nil, errors.New("rules: NewEtcdSource: nil client")
	case h == nil:
		return nil, errors.New("rules: NewEtcdSource: nil Holder")
	case prefix == "":
		return nil, errors.New("rules: NewEtcdSource: empty prefix would watch all of etcd")
	}
	if _, err := opt.withDefaults(); err != nil {
		return nil, err
	}
	e := &EtcdSource{cli: cli, prefix: prefix, h: h, opt: opt, cfg: newSourceConfig(opts)}
	if e.cfg.base != nil {
		if err := e.cfg.base.Validate(); err != nil {
			return nil, fmt.Errorf("rules: NewEtcdSource: base set: %w", err)
		}
	}
	lw, err := etcdwatch.New(cli, etcdwatch.Config{
		Prefix: prefix, Timeout: e.cfg.timeout, Clock: e.cfg.clock,
		Backoff:        etcdwatch.Backoff{Min: e.cfg.backoffMin, Max: e.cfg.backoffMax},
		ProgressNotify: true, ProbeEvery: e.cfg.interval,
	}, etcdwatch.Handler{
		OnList:   func(ctx context.Context, kvs []*mvccpb.KeyValue, rev int64) { _ = e.install(ctx, kvs, rev) }, // reported inside
		OnEvents: func(_ context.Context, evs []*clientv3.Event, rev int64) { e.apply(evs, rev) },
		OnError:  e.failed,
		OnProbe:  e.probe,
	})
	if err != nil {
		return nil, fmt.Errorf("rules: NewEtcdSource: %w", err)
	}
	e.lw = lw
	return e, nil
}

// Load lists the prefix once and, if the rules are good, stores their snapshot. It returns
// a network error, or the error that rejected the set (the Holder keeps its snapshot).
func (e *EtcdSource) Load(ctx context.Context) error {
	kvs, rev, err := e.lw.List(ctx)
	if err != nil {
		err = fmt.Errorf("rules: %w", err)
		e.cfg.report(&e.st, err, "listing rules in etcd failed", "prefix", e.prefix)
		return err
	}
	return e.install(ctx, kvs, rev)
}

// install takes the whole prefix as of rev and rebuilds the snapshot; it returns the
// error that rejected the set.
func (e *EtcdSource) install(ctx context.Context, kvs []*mvccpb.KeyValue, rev int64) error {
	e.take(ctx, kvs, rev)
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.rebuildLocked()
}

// take replaces kvs with the prefix as of rev, unless what is held is newer.
func (e *EtcdSource) take(ctx context.Context, kvs []*mvccpb.KeyValue, rev int64) {
	e.mu.Lock()
	if rev < e.rev {
		e.mu.Unlock()
		return // a watch already brought us further (this was a Load racing it)
	}
	old := e.kvs
	e.kvs = make(map[string]*etcdEntry, len(kvs))
	var lookBack []*etcdEntry // refused, with no good version known here, but with older versions in etcd
	var lookKeys []string
	for _, kv := range kvs {
		k := string(kv.Key)
		if o, ok := old[k]; ok && o.modRev == kv.ModRevision {
			e.kvs[k] = o // unchanged: keep the parsed rule
			continue
		}
		en := e.parse(k, kv.Value, kv.ModRevision, old[k])
		e.kvs[k] = en
		if en.err != nil && en.good == nil && kv.Version > 1 {
			lookBack, lookKeys = append(lookBack, en), append(lookKeys, k)
		}
	}
	e.rev = rev
	e.st.setRevision(e.rev)
	e.mu.Unlock()
	// A process that starts after a good rule was made bad never saw the good version; the
	// others keep it. Read it from etcd's history (unless compacted away) so every enforcer
	// keeps the same previous version. Outside the lock: it is I/O.
	for i, en := range lookBack {
		if r := e.previousGood(ctx, lookKeys[i], en.modRev); r != nil {
			e.mu.Lock()
			if en.good == nil {
				en.good = r
			}
			e.mu.Unlock()
		}
	}
}

// maxLookBack bounds how many older versions of a refused key previousGood reads.
const maxLookBack = 5

// previousGood returns the newest good rule key held before revision modRev (at most
// maxLookBack versions back), or nil: none, compacted, or etcd unreachable.
func (e *EtcdSource) previousGood(ctx context.Context, key string, modRev int64) *Rule {
	rev := modRev - 1
	for range maxLookBack {
		if rev <= 0 {
			return nil
		}
		gctx, cancel := context.WithTimeout(ctx, e.cfg.timeout)
		resp, err := e.cli.Get(gctx, key, clientv3.WithRev(rev))
		cancel()
		if err != nil || len(resp.Kvs) == 0 {
			return nil // compacted, deleted then, or unreachable
		}
		kv := resp.Kvs[0]
		if en := e.parse(key, kv.Value, kv.ModRevision, nil); en.err == nil {
			return en.rule
		}
		rev = kv.ModRevision - 1
	}
	return nil
}

// parse parses and checks one key's rule alone; prev is the key's previous entry (nil if
// none), whose good rule a bad one keeps.
func (e *EtcdSource) parse(key string, value []byte, modRev int64, prev *etcdEntry) *etcdEntry {
	r, err := parseRule(value, key)
	if err == nil && r.ID == "" {
		r.ID = strings.TrimPrefix(key, e.prefix)
		r.ID = strings.TrimPrefix(r.ID, "/")
	}
	if err == nil {
		opt := e.opt
		opt.Now = e.cfg.clock.Now()
		_, err = Compile(&Set{Rules: []Rule{*r}}, opt)
	}
	en := &etcdEntry{modRev: modRev, rule: r, err: err}
	switch {
	case err == nil:
		en.good = r
	case prev != nil:
		en.good = prev.good
	}
	return en
}

// RefusedRule is one etcd key whose rule is refused (see EtcdSource).
type RefusedRule struct {
	Key string
	Err error
	// Kept is true when the key's previous good rule still applies (false: none does).
	Kept bool
}

// pick chooses each key's rule (its own, or its last good one when refused) in key order,
// and lists the refused keys.
func (e *EtcdSource) pick() (keys []string, rules map[string]*Rule, refused []RefusedRule) {
	rules = make(map[string]*Rule, len(e.kvs))
	ids := make(map[string]string, len(e.kvs)) // rule id → key that holds it
	for _, k := range sortedKeys(e.kvs) {      // key order: the same on every enforcer
		en := e.kvs[k]
		err, r := en.err, en.rule
		if err == nil {
			if other, dup := ids[r.ID]; dup {
				err = &Error{File: k, Rule: r.ID, Field: "id", Msg: fmt.Sprintf("%q is also the id of the rule at %s; ids must be unique", r.ID, other)}
			}
		}
		if err != nil {
			r = en.good
			if r != nil {
				if _, dup := ids[r.ID]; dup {
					r = nil
				}
			}
			refused = append(refused, RefusedRule{Key: k, Err: err, Kept: r != nil})
			if !en.refusedLogged { // logged once per revision; counted by Status().Refused, not Failures
				en.refusedLogged = true
				e.cfg.logger.Warn("etcd rule refused; the other rules apply", "key", k, "kept-previous-version", r != nil, "error", err)
				if e.cfg.onError != nil {
					e.cfg.onError(err)
				}
			}
			if r == nil {
				continue
			}
		}
		ids[r.ID] = k
		rules[k] = r
		keys = append(keys, k)
		if e.cfg.base != nil && !en.shadowLogged && r == en.rule {
			en.shadowLogged = true
			if hasID(e.cfg.base, r.ID) {
				e.cfg.logger.Warn("etcd rule replaces the file rule of the same id", "key", k, "rule", r.ID)
			}
		}
	}
	return keys, rules, refused
}

// rebuildLocked compiles base + etcd rules and stores the snapshot if it is good and new.
// Caller holds e.mu (compiling is CPU only; the hooks it calls must not call back).
func (e *EtcdSource) rebuildLocked() error {
	keys, rules, refused := e.pick()
	e.st.setRefused(refused)
	set, err := layer(e.cfg.base, keys, func(k string) (*Rule, error) { return rules[k], nil })
	var snap *Snapshot
	if err == nil {
		opt := e.opt
		opt.Now = e.cfg.clock.Now()
		snap, err = Compile(set, opt)
	}
	if err != nil {
		e.cfg.report(&e.st, err, "rule set in etcd rejected; keeping the rules in force", "prefix", e.prefix, "revision", e.rev)
		return err
	}
	if snap.Version() == e.lastVer {
		e.st.ok()
		return nil
	}
	e.lastVer = snap.Version()
	fromFile := 0
	if e.cfg.base != nil {
		fromFile = len(set.Rules) - len(keys) // base rules not replaced by an etcd rule
	}
	e.cfg.store(&e.st, e.h, snap, "rules loaded", "prefix", e.prefix, "revision", e.rev,
		"from-etcd", len(keys), "from-file", fromFile, "refused", len(refused))
	return nil
}

// SetBase replaces the base set (see WithBase; nil removes it) and rebuilds the snapshot
// from it and the etcd rules already known: wire it to SIGHUP when the base is a file. An
// invalid base is refused (nothing changes); an error of the combined set is returned and
// reported like any rejected set. Before etcd has answered, the new base alone is stored
// in the Holder (as a caller serving the base at start would), so it serves at once.
func (e *EtcdSource) SetBase(base *Set) error {
	if base != nil {
		if err := base.Validate(); err != nil {
			return fmt.Errorf("rules: SetBase: %w", err)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.kvs == nil { // nothing from etcd yet: Load or Run will build with the new base
		if base != nil {
			opt := e.opt
			opt.Now = e.cfg.clock.Now()
			snap, err := Compile(base, opt)
			if err != nil {
				return fmt.Errorf("rules: SetBase: %w", err)
			}
			e.h.Store(snap)
		}
		e.cfg.base = base
		return nil
	}
	e.cfg.base = base
	return e.rebuildLocked()
}

// Run keeps the Holder in step with etcd until ctx is done (it returns ctx.Err()) or Close
// is called (ErrClosed). Run may be called once.
func (e *EtcdSource) Run(ctx context.Context) error {
	return runErr("EtcdSource", e.loop.Run(ctx, e.lw.Run)) // after a Load, it watches on from Load's revision
}

// failed reports a failed list or an ended watch; the Holder keeps the snapshot in force.
func (e *EtcdSource) failed(_ context.Context, f etcdwatch.Failure) {
	err := fmt.Errorf("rules: %w", f.Err)
	if f.Listing {
		e.cfg.report(&e.st, err, "listing rules in etcd failed", "prefix", e.prefix)
		return
	}
	if f.Compacted {
		e.cfg.logger.Info("rules watch compacted; listing again", "prefix", e.prefix)
		return
	}
	e.cfg.report(&e.st, err, "rules watch failed; listing again", "prefix", e.prefix)
}

var errUnreachable = errors.New("rules: etcd unreachable")

// probe asks etcd for the prefix's key count: a failure means etcd is unreachable (or has
// no leader) even if the watch has not noticed; it is reported, and a later success clears
// it.
func (e *EtcdSource) probe(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, e.cfg.timeout)
	defer cancel()
	_, err := e.cli.Get(pctx, e.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if ctx.Err() != nil {
		return
	}
	st := e.st.get()
	down := st.LastError != nil && errors.Is(st.LastError, errUnreachable)
	switch {
	case err != nil && !down: // report the outage once, not every probe
		e.cfg.report(&e.st, fmt.Errorf("%w: %w", errUnreachable, err), "etcd probe failed; keeping the rules in force", "prefix", e.prefix)
	case err == nil && down:
		e.cfg.logger.Info("etcd reachable again", "prefix", e.prefix)
		e.st.ok()
	}
}

// apply folds one watch response's events (at revision rev) into kvs and rebuilds.
func (e *EtcdSource) apply(evs []*clientv3.Event, rev int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(evs) == 0 { // progress notification: everything up to it has been seen
		if rev > e.rev {
			e.rev = rev
			e.st.setRevision(rev)
		}
		return
	}
	for _, ev := range evs {
		if ev.Kv.ModRevision <= e.rev {
			continue // a list already brought us past it
		}
		k := string(ev.Kv.Key)
		switch ev.Type {
		case mvccpb.PUT:
			e.kvs[k] = e.parse(k, ev.Kv.Value, ev.Kv.ModRevision, e.kvs[k])
		case mvccpb.DELETE:
			delete(e.kvs, k)
		}
		e.rev = ev.Kv.ModRevision
	}
	e.st.setRevision(e.rev)
	_ = e.rebuildLocked() // reported inside
}

// Status reports the last good version, the last error and the revision.
func (e *EtcdSource) Status() Status { return e.st.get() }

// Close stops Run and waits for it to return. Idempotent: every call waits; the Holder
// keeps its snapshot.
func (e *EtcdSource) Close() error {
	e.loop.Close()
	return nil
}

func hasID(s *Set, id string) bool {
	for i := range s.Rules {
		if s.Rules[i].ID == id {
			return true
		}
	}
	return false
}
