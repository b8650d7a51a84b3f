package rules

// Descriptor rules: each domain's tree of descriptor rules, the walk a request's
// descriptor takes through it, and the identity by: descriptor counts.

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// descEdge is one entry of a descriptor rule's match, ready to test.
type descEdge struct {
	key    string
	value  string   // the exact value, or the wildcard
	parts  []string // a wildcard split at '*'; nil for an exact value or any value
	any    bool     // no value: any value
	shared bool
}

// descEdges prepares a descriptor match; nil for none.
func descEdges(d []DescriptorEntry) []descEdge {
	if len(d) == 0 {
		return nil
	}
	out := make([]descEdge, len(d))
	for i, e := range d {
		out[i] = descEdge{key: e.Key, value: e.Value, any: e.Value == "", shared: e.Shared}
		if strings.Contains(e.Value, "*") {
			out[i].parts = strings.Split(e.Value, "*")
		}
	}
	return out
}

// fits reports whether a request's entry fits the edge.
func (e *descEdge) fits(x *Entry) bool {
	switch {
	case e.key != x.Key:
		return false
	case e.any:
		return true
	case e.parts != nil:
		return wildMatch(e.parts, x.Value)
	}
	return e.value == x.Value
}

// wildMatch reports whether v matches a wildcard split at its '*'s: v starts with the
// first part, ends with the last, and holds the middle ones in order between them.
func wildMatch(parts []string, v string) bool {
	first, last := parts[0], parts[len(parts)-1]
	if len(v) < len(first)+len(last) || !strings.HasPrefix(v, first) || !strings.HasSuffix(v, last) {
		return false
	}
	rest := v[len(first) : len(v)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// dnode is one node of a domain's descriptor tree: the edges to the next depth (an exact
// value, a wildcard, any value) and the rules whose match ends here, by mode, best first.
type dnode struct {
	exact map[Entry]*dnode
	wild  []dwild // in the order first written: the first that matches wins
	any   map[string]*dnode
	inner bool // has edges: a walk may go on from here
	rules [2][]*crule
}

type dwild struct {
	edge descEdge
	node *dnode
	by   string // the first rule that wrote it, for a conflict's error
}

// child returns the node the edge leads to, made if need be. A wildcard written shared
// by one rule and not by another is an error: its values are counted one way.
func (n *dnode) child(e *descEdge, rule string) (*dnode, error) {
	switch {
	case e.any:
		if n.any == nil {
			n.any = map[string]*dnode{}
		}
		c := n.any[e.key]
		if c == nil {
			c = &dnode{}
			n.any[e.key] = c
		}
		return c, nil
	case e.parts != nil:
		for i := range n.wild {
			w := &n.wild[i]
			if w.edge.key == e.key && w.edge.value == e.value {
				if w.edge.shared != e.shared {
					return nil, fmt.Errorf("%v, but rule %q matches the same entries with shared: %v; a wildcard's values are counted one way", e.shared, w.by, w.edge.shared)
				}
				return w.node, nil
			}
		}
		n.wild = append(n.wild, dwild{edge: *e, node: &dnode{}, by: rule})
		return n.wild[len(n.wild)-1].node, nil
	}
	if n.exact == nil {
		n.exact = map[Entry]*dnode{}
	}
	k := Entry{e.key, e.value}
	c := n.exact[k]
	if c == nil {
		c = &dnode{}
		n.exact[k] = c
	}
	return c, nil
}

// buildDescriptors files every descriptor rule in its domain's tree.
func (s *Snapshot) buildDescriptors(set *Set) error {
	var errs errList
	for i := range s.rules {
		r := &s.rules[i]
		if r.desc == nil {
			continue
		}
		if s.domains == nil {
			s.domains = map[string]*dnode{}
		}
		n := s.domains[r.m.Domain]
		if n == nil {
			n = &dnode{}
			s.domains[r.m.Domain] = n
		}
		for j := range r.desc {
			c, err := n.child(&r.desc[j], r.c.ID)
			if err != nil {
				errs.add(ruleErr(&set.Rules[i], i, set.file, fmt.Sprintf("match.descriptor[%d].shared", j), "%v", err))
				break
			}
			n = c
		}
		n.rules[r.c.Mode] = append(n.rules[r.c.Mode], r)
	}
	for _, n := range s.domains {
		n.finish()
	}
	return errs.err()
}

// finish sorts the rules of n and of every node below it, best first, and marks inner
// nodes.
func (n *dnode) finish() {
	for _, rs := range n.rules {
		slices.SortFunc(rs, better)
	}
	n.inner = len(n.exact)+len(n.wild)+len(n.any) > 0
	for _, c := range n.exact {
		c.finish()
	}
	for _, w := range n.wild {
		w.node.finish()
	}
	for _, c := range n.any {
		c.finish()
	}
}

// matchDescriptor appends the descriptor rules that apply to a: it walks the domain's
// tree, at each depth the exact value, else the first wildcard that matches, else the key
// alone, and takes the winners of the node the last entry reaches (see the package doc).
func (s *Snapshot) matchDescriptor(a *Attrs, now time.Time, dst []Matched) []Matched {
	n := s.domains[a.Domain]
	if n == nil {
		return dst
	}
	var shared []string // shared[i]: the shared wildcard that matched entry i (made when one does)
	last := len(a.Entries) - 1
	for i := range a.Entries {
		e := &a.Entries[i]
		next := n.exact[*e]
		if next == nil {
			for j := range n.wild {
				w := &n.wild[j]
				if w.edge.key == e.Key && wildMatch(w.edge.parts, e.Value) {
					next = w.node
					if w.edge.shared {
						if shared == nil {
							shared = make([]string, len(a.Entries))
						}
						shared[i] = w.edge.value
					}
					break
				}
			}
		}
		if next == nil {
			next = n.any[e.Key]
		}
		if next == nil || (i < last && !next.inner) {
			return dst // no rule's path is this descriptor, and no going back
		}
		n = next
	}
	ip := a.IP.Unmap().WithZone("")
	var descID string
	for mode := range n.rules {
		r := limited(first(n.rules[mode], a, ip, now))
		if r == nil {
			continue
		}
		id, ok := descID, true
		switch {
		case r.c.By != ByDescriptor:
			if ok = known(r.c.By, a, ip); ok {
				id, ok = s.identity(r.c.By, a, ip)
			}
		case id == "":
			descID = DescriptorIdentity(a.Domain, a.Entries, shared)
			id = descID
		}
		if ok {
			dst = append(dst, Matched{Rule: &r.c, Identity: id, Cost: r.costOf(a.Endpoint)})
		}
	}
	return dst
}

// fitsDescriptor reports whether a's descriptor fits r's descriptor match, whatever a
// more specific rule would win (for Candidates).
func (r *crule) fitsDescriptor(a *Attrs) bool {
	if r.m.Domain != a.Domain || len(r.desc) != len(a.Entries) {
		return false
	}
	for i := range r.desc {
		if !r.desc[i].fits(&a.Entries[i]) {
			return false
		}
	}
	return true
}

// DescriptorIdentity is the identity by: descriptor counts a request descriptor under:
// "desc:" + domain, then "/" + key + "=" + value for each entry in order, where '%', '/',
// '=' and '~' in the domain, keys and values are escaped (%25, %2F, %3D, %7E) so that two
// descriptors never share an identity. An entry that shared[i] names (a shared wildcard
// matched it; shared may be nil) is written "/" + key + "~" + the wildcard: every value
// it matches is counted as one. An identity longer than bucket.MaxIdentityLen is
// "desc:sha256:" and the 64 hex digits of its SHA-256.
func DescriptorIdentity(domain string, entries []Entry, shared []string) string {
	var buf [192]byte
	b := append(buf[:0], "desc:"...)
	b = appendEscaped(b, domain)
	for i := range entries {
		e := &entries[i]
		b = append(b, '/')
		b = appendEscaped(b, e.Key)
		if i < len(shared) && shared[i] != "" {
			b = append(b, '~')
			b = appendEscaped(b, shared[i])
			continue
		}
		b = append(b, '=')
		b = appendEscaped(b, e.Value)
	}
	if len(b) > bucket.MaxIdentityLen {
		sum := sha256.Sum256(b)
		return "desc:sha256:" + hex.EncodeToString(sum[:])
	}
	return string(b)
}

func appendEscaped(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%', '/', '=', '~':
			b = append(b, '%', "0123456789ABCDEF"[c>>4], "0123456789ABCDEF"[c&15])
		default:
			b = append(b, c)
		}
	}
	return b
}

// HasDomain reports whether s has descriptor rules of domain d (envoyproxy/ratelimit: the
// domain is configured).
func (s *Snapshot) HasDomain(d string) bool {
	_, ok := s.domains[d]
	return ok
}

// HasDescriptors reports whether s has descriptor rules: only then need a front end pass
// a request's descriptor entries (Attrs.Entries).
func (s *Snapshot) HasDescriptors() bool { return s.domains != nil }

// HasReplaces reports whether some rule of s replaces others (Rule.Replaces): only then
// need a caller look for replaced rules (DropReplaced, Replacing).
func (s *Snapshot) HasReplaces() bool { return s.hasReplaces }

// Replacing appends to dst the ids the rules that apply to a (as Match says) replace.
// For a front end whose request is several checks (Envoy RLS descriptors): what one
// replaces applies to all (see DropReplaced).
func (s *Snapshot) Replacing(a *Attrs, now time.Time, dst []string) []string {
	if !s.hasReplaces {
		return dst
	}
	for _, m := range s.Match(a, now, nil) {
		dst = append(dst, m.Rule.Replaces...)
	}
	return dst
}

// DropReplaced removes from ms, in place and keeping the order, every rule that a rule
// of ms replaces or that replaced names (the other checks' Replacing), and returns the
// shortened slice. As in envoyproxy/ratelimit, a rule that is itself replaced still
// replaces.
func DropReplaced(ms []Matched, replaced []string) []Matched {
	drop := func(id string) bool {
		if slices.Contains(replaced, id) {
			return true
		}
		for i := range ms {
			if slices.Contains(ms[i].Rule.Replaces, id) {
				return true
			}
		}
		return false
	}
	var gone uint64 // bit i: ms[i] is replaced (decided before anything moves)
	for i := range ms {
		if i < 64 && drop(ms[i].Rule.ID) {
			gone |= 1 << i
		}
	}
	if gone == 0 {
		return ms
	}
	out := ms[:0]
	for i := range ms {
		if i >= 64 || gone&(1<<i) == 0 {
			out = append(out, ms[i])
		}
	}
	clear(ms[len(out):])
	return out
}
