package enforcer

import (
	"fmt"

	"github.com/allot-dev/allot/pkg/rules"
)

// validateDescriptor checks a request's descriptor (rules.Attrs.Domain and Entries)
// against the bounds, as the Envoy RLS front end does before it gets here: so a caller of
// the library cannot hand the rules more than a gateway could.
func (l *InputLimits) validateDescriptor(a *rules.Attrs) error {
	if n := len(a.Domain); n > l.MaxDomainLen {
		return fmt.Errorf("%w: domain is %d bytes, more than %d", ErrInvalid, n, l.MaxDomainLen)
	}
	if n := len(a.Entries); n > l.MaxEntries {
		return fmt.Errorf("%w: descriptor has %d entries, more than %d", ErrInvalid, n, l.MaxEntries)
	}
	for j := range a.Entries {
		k, v := a.Entries[j].Key, a.Entries[j].Value
		switch {
		case k == "":
			return fmt.Errorf("%w: descriptor entry %d: key is empty", ErrInvalid, j)
		case len(k) > l.MaxKeyLen:
			return fmt.Errorf("%w: descriptor entry %d: key is %d bytes, more than %d", ErrInvalid, j, len(k), l.MaxKeyLen)
		case len(v) > l.MaxValueLen:
			return fmt.Errorf("%w: descriptor entry %d (%.64q): value is %d bytes, more than %d", ErrInvalid, j, k, len(v), l.MaxValueLen)
		}
	}
	return nil
}

// JoinReplaces is for a front end whose one gateway request is several checks (Envoy
// RLS: one per descriptor): a rule that applies to any of them and replaces others
// (rules.Rule.Replaces) replaces them in all, as envoyproxy/ratelimit does, so it sets
// every request's Replaced to what the rules matching any of them replace. It does
// nothing (and allocates nothing) unless the rules in force replace something. The
// requests must have passed Validate. If the rules change before the checks, a replaced
// id of the old rules may no longer exist (nothing is replaced) or a new replacing rule
// is missed (a limit more applies): the error is under, never over.
func (e *Enforcer) JoinReplaces(reqs []Request) {
	snap := e.cfg.Rules.Current()
	if snap == nil || !snap.HasReplaces() || len(reqs) < 2 {
		return // one check: Check drops what its own rules replace
	}
	now := e.clock.Now()
	var ids []string
	for i := range reqs {
		ids = snap.Replacing(&reqs[i].Attrs, now, ids)
	}
	for i := range reqs {
		reqs[i].Replaced = ids
	}
}
