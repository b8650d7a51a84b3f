package envoyrl

// Reading YAML nodes as envoyproxy/ratelimit's loader does: which keys it knows and
// where, the value types it accepts, and the bounds on a hostile document.

import (
	"fmt"

	"gopkg.in/yaml.v3"
)

// validKeys is envoyproxy/ratelimit's list: it checks keys against it at every level,
// so a known key out of place is accepted there (and ignored); here it is a warning.
var validKeys = map[string]bool{
	"domain": true, "key": true, "value": true, "descriptors": true, "rate_limit": true,
	"unit": true, "requests_per_unit": true, "unlimited": true, "shadow_mode": true,
	"quota_mode": true, "name": true, "replaces": true, "detailed_metric": true,
	"value_to_metric": true, "share_threshold": true, "metadata": true,
}

// Where each key has a meaning.
var (
	rootKeys       = map[string]bool{"domain": true, "descriptors": true}
	descriptorKeys = map[string]bool{
		"key": true, "value": true, "descriptors": true, "rate_limit": true, "shadow_mode": true,
		"quota_mode": true, "detailed_metric": true, "value_to_metric": true,
		"share_threshold": true, "metadata": true,
	}
	rateLimitKeys = map[string]bool{
		"unit": true, "requests_per_unit": true, "unlimited": true, "name": true, "replaces": true,
	}
	replacesKeys = map[string]bool{"name": true}
)

// maxVisits bounds the walk of a document of n bytes: without aliases a node is visited
// a few times, and a document has fewer nodes than bytes, so only aliases expanded beyond
// reason (a billion laughs) reach it, and are refused.
func maxVisits(n int) int { return 8*n + 1<<16 }

type parser struct {
	file   string
	errs   []error
	warns  []string
	visits int
	limit  int
	over   bool
	// quiet: a second reading of mappings checkKeys read already says nothing again.
	quiet bool
	said  map[string]bool
}

// maxErrors bounds the errors (and warnings) said of one file.
const maxErrors = 100

func (p *parser) errorf(line int, format string, args ...any) {
	if p.quiet {
		return
	}
	e := &Error{File: p.file, Line: line, Msg: fmt.Sprintf(format, args...)}
	if p.said[e.Error()] || len(p.errs) > maxErrors {
		return // an alias's repeated problem is said once
	}
	if p.said == nil {
		p.said = map[string]bool{}
	}
	p.said[e.Error()] = true
	if len(p.errs) == maxErrors {
		e = &Error{File: p.file, Msg: "too many errors; the rest are not said"}
	}
	p.errs = append(p.errs, e)
}

func (p *parser) warnf(line int, format string, args ...any) {
	if p.quiet {
		return
	}
	w := (&Error{File: p.file, Line: line, Msg: fmt.Sprintf(format, args...)}).Error()
	if p.said[w] || len(p.warns) >= maxErrors {
		return
	}
	if p.said == nil {
		p.said = map[string]bool{}
	}
	p.said[w] = true
	p.warns = append(p.warns, w)
}

// resolve follows aliases, counting visits.
func (p *parser) resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode; i++ {
		if i > 100 {
			return nil
		}
		n = n.Alias
	}
	p.visits++
	if p.visits > p.limit {
		if !p.over {
			p.over = true
			p.errorf(0, "document too large once its aliases are expanded")
		}
		return nil
	}
	return n
}

type pair struct {
	key   string
	kline int
	val   *yaml.Node
}

// pairs reads a mapping's entries in order, merge keys (<<) expanded and a later
// duplicate overriding an earlier one (as envoyproxy/ratelimit's YAML library does), with
// a warning. A key that is not a string is an error.
func (p *parser) pairs(m *yaml.Node, depth int) []pair {
	var out []pair
	idx := map[string]int{}
	add := func(pr pair, merged bool) {
		if i, ok := idx[pr.key]; ok {
			if !merged {
				p.warnf(pr.kline, "key '%s' repeats the one of line %d, whose value it replaces", pr.key, out[i].kline)
				out[i] = pr
			}
			return
		}
		idx[pr.key] = len(out)
		out = append(out, pr)
	}
	var merges []pair
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := p.resolve(m.Content[i]), m.Content[i+1]
		if k == nil {
			return out
		}
		if k.Kind == yaml.ScalarNode && k.Tag == "!!merge" && depth < 10 {
			vv := p.resolve(v)
			if vv == nil {
				return out
			}
			var srcs []*yaml.Node
			if vv.Kind == yaml.SequenceNode {
				srcs = vv.Content
			} else {
				srcs = []*yaml.Node{vv}
			}
			for _, s := range srcs {
				s = p.resolve(s)
				if s == nil || s.Kind != yaml.MappingNode {
					p.errorf(k.Line, "merge key '<<' must name a mapping or a list of mappings")
					continue
				}
				merges = append(merges, p.pairs(s, depth+1)...)
			}
			continue
		}
		if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
			p.errorf(k.Line, "key is not a string: %s", describe(k))
			continue
		}
		add(pair{key: k.Value, kline: k.Line, val: v}, false)
	}
	for _, pr := range merges {
		add(pr, true)
	}
	return out
}

// quietPairs rereads a mapping checkKeys has read and reported on.
func (p *parser) quietPairs(m *yaml.Node) []pair {
	p.quiet = true
	defer func() { p.quiet = false }()
	return p.pairs(m, 0)
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	if n.ShortTag() == "!!null" {
		return "null"
	}
	return fmt.Sprintf("%q", n.Value)
}

// checkKeys mirrors envoyproxy/ratelimit's validateYamlKeys: every key anywhere (but
// under metadata) is one of validKeys, every list holds mappings only, and every leaf is
// a string, an integer, a boolean or null (a float, say, is refused).
func (p *parser) checkKeys(m *yaml.Node, depth int) {
	if depth > 64 {
		p.errorf(m.Line, "nested too deep")
		return
	}
	for _, pr := range p.pairs(m, 0) {
		if !validKeys[pr.key] {
			p.errorf(pr.kline, "unknown key '%s'", pr.key)
			continue
		}
		if pr.key == "metadata" {
			continue
		}
		v := p.resolve(pr.val)
		if v == nil {
			return
		}
		switch v.Kind {
		case yaml.SequenceNode:
			for _, e := range v.Content {
				e = p.resolve(e)
				if e == nil {
					return
				}
				if e.Kind != yaml.MappingNode {
					p.errorf(e.Line, "list '%s' holds %s: its entries must be mappings", pr.key, describe(e))
					continue
				}
				p.checkKeys(e, depth+1)
			}
		case yaml.MappingNode:
			p.checkKeys(v, depth+1)
		case yaml.ScalarNode:
			switch v.ShortTag() {
			case "!!str", "!!bool", "!!null", "!!timestamp":
			case "!!int":
				var i int64
				if err := v.Decode(&i); err != nil {
					p.errorf(v.Line, "'%s': integer %s out of range", pr.key, v.Value)
				}
			case "!!float":
				p.errorf(v.Line, "'%s': %s is a float; only strings, integers and booleans are accepted", pr.key, v.Value)
			default:
				p.errorf(v.Line, "'%s': value of type %s is not accepted", pr.key, v.ShortTag())
			}
		}
	}
}

// misplaced warns about known keys where they mean nothing.
func (p *parser) misplaced(prs []pair, here map[string]bool, what string) {
	for _, pr := range prs {
		if validKeys[pr.key] && !here[pr.key] {
			p.warnf(pr.kline, "key '%s' has no meaning in %s; envoyproxy/ratelimit ignores it", pr.key, what)
		}
	}
}

func (p *parser) str(pr pair) string {
	v := p.resolve(pr.val)
	if v == nil {
		return ""
	}
	if v.Kind != yaml.ScalarNode {
		p.errorf(v.Line, "'%s' must be a string, not %s", pr.key, describe(v))
		return ""
	}
	if v.ShortTag() == "!!null" {
		return ""
	}
	return v.Value
}

// yaml11 are YAML 1.1's booleans, which envoyproxy/ratelimit's YAML library reads as such.
var yaml11 = map[string]bool{
	"y": true, "Y": true, "yes": true, "Yes": true, "YES": true, "on": true, "On": true, "ON": true,
	"n": false, "N": false, "no": false, "No": false, "NO": false, "off": false, "Off": false, "OFF": false,
}

func (p *parser) boolean(pr pair) bool {
	v := p.resolve(pr.val)
	if v == nil {
		return false
	}
	if v.Kind == yaml.ScalarNode {
		switch v.ShortTag() {
		case "!!null":
			return false
		case "!!bool":
			var b bool
			if v.Decode(&b) == nil {
				return b
			}
		case "!!str":
			if b, ok := yaml11[v.Value]; ok && v.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) == 0 {
				return b
			}
		}
	}
	p.errorf(v.Line, "'%s' must be true or false, not %s", pr.key, describe(v))
	return false
}

func (p *parser) uint32(pr pair) uint32 {
	v := p.resolve(pr.val)
	if v == nil {
		return 0
	}
	if v.Kind == yaml.ScalarNode {
		switch v.ShortTag() {
		case "!!null":
			return 0
		case "!!int":
			var n uint32
			if v.Decode(&n) == nil {
				return n
			}
		case "!!float":
			return 0 // refused by checkKeys already
		}
	}
	p.errorf(v.Line, "'%s' must be an integer from 0 to %d, not %s", pr.key, uint32(1<<32-1), describe(v))
	return 0
}

// list returns a list's entries (mappings; checkKeys refused the others), nil for null.
func (p *parser) list(pr pair) []*yaml.Node {
	v := p.resolve(pr.val)
	if v == nil {
		return nil
	}
	switch {
	case v.Kind == yaml.SequenceNode:
		var out []*yaml.Node
		for _, e := range v.Content {
			if e = p.resolve(e); e != nil && e.Kind == yaml.MappingNode {
				out = append(out, e)
			}
		}
		return out
	case v.Kind == yaml.ScalarNode && v.ShortTag() == "!!null":
		return nil
	}
	p.errorf(v.Line, "'%s' must be a list, not %s", pr.key, describe(v))
	return nil
}

// mapping returns a mapping, nil for null.
func (p *parser) mapping(pr pair) *yaml.Node {
	v := p.resolve(pr.val)
	if v == nil {
		return nil
	}
	switch {
	case v.Kind == yaml.MappingNode:
		return v
	case v.Kind == yaml.ScalarNode && v.ShortTag() == "!!null":
		return nil
	}
	p.errorf(v.Line, "'%s' must be a mapping, not %s", pr.key, describe(v))
	return nil
}
