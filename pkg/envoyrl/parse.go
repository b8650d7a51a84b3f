package envoyrl

// Parse: one file, its descriptor tree and its rate limits.

import (
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

var lineRE = regexp.MustCompile(`^yaml: line (\d+): `)

// Parse reads one envoyproxy/ratelimit configuration file; file names it in errors and
// warnings. All the problems of the file are joined into one error wrapping ErrInvalid.
func Parse(file string, data []byte) (*Config, error) {
	p := &parser{file: file, limit: maxVisits(len(data))}
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		line := 0
		msg := err.Error()
		if m := lineRE.FindStringSubmatch(msg); m != nil {
			line, _ = strconv.Atoi(m[1])
			msg = "yaml: " + msg[len(m[0]):]
		}
		p.errorf(line, "%s", msg)
		return nil, errors.Join(p.errs...)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		p.warnf(extra.Line, "a second YAML document; envoyproxy/ratelimit reads the first only")
	}
	cfg := &Config{File: file}
	var root *yaml.Node
	if len(doc.Content) > 0 {
		root = p.resolve(doc.Content[0])
	}
	switch {
	case root == nil || (root.Kind == yaml.ScalarNode && root.ShortTag() == "!!null"):
		// An empty file: no domain, said below.
	case root.Kind != yaml.MappingNode:
		p.errorf(root.Line, "the file must be a mapping (domain, descriptors), not %s", describe(root))
		return nil, errors.Join(p.errs...)
	default:
		p.checkKeys(root, 0)
		if p.over {
			return nil, errors.Join(p.errs...)
		}
		p.quiet = true
		prs := p.pairs(root, 0)
		p.quiet = false
		p.misplaced(prs, rootKeys, "the file's top level")
		for _, pr := range prs {
			switch pr.key {
			case "domain":
				cfg.Domain, cfg.Line = p.str(pr), pr.kline
			case "descriptors":
				cfg.Descriptors = p.descriptors(p.list(pr), 0)
			}
		}
	}
	if cfg.Domain == "" {
		line := cfg.Line
		if line == 0 {
			line = 1
		}
		p.errorf(line, "config file cannot have empty domain")
	}
	p.checkReplaces(cfg)
	if p.over || len(p.errs) > 0 {
		return nil, errors.Join(p.errs...)
	}
	cfg.Warnings = p.warns
	return cfg, nil
}

func (p *parser) descriptors(nodes []*yaml.Node, depth int) []Descriptor {
	var out []Descriptor
	seen := map[string]int{}
	for _, n := range nodes {
		if depth > 64 || p.over {
			return out
		}
		d := Descriptor{File: p.file, Line: n.Line}
		prs := p.quietPairs(n)
		p.misplaced(prs, descriptorKeys, "a descriptor")
		hasKey := false
		for _, pr := range prs {
			switch pr.key {
			case "key":
				d.Key, hasKey = p.str(pr), true
			case "value":
				d.Value = p.str(pr)
			case "rate_limit":
				if m := p.mapping(pr); m != nil {
					d.RateLimit = p.rateLimit(m)
				}
			case "descriptors":
				d.Descriptors = p.descriptors(p.list(pr), depth+1)
			case "shadow_mode":
				d.ShadowMode = p.boolean(pr)
			case "quota_mode":
				d.QuotaMode = p.boolean(pr)
			case "detailed_metric":
				d.DetailedMetric = p.boolean(pr)
			case "value_to_metric":
				d.ValueToMetric = p.boolean(pr)
			case "share_threshold":
				d.ShareThreshold = p.boolean(pr)
			case "metadata":
				if m := p.mapping(pr); m != nil {
					d.Metadata = p.metadata(m)
				}
			}
		}
		if d.Key == "" {
			if hasKey {
				p.errorf(d.Line, "descriptor has empty key")
			} else {
				p.errorf(d.Line, "descriptor has no key")
			}
		} else {
			ck := d.CompositeKey()
			if first, dup := seen[ck]; dup {
				p.errorf(d.Line, "duplicate descriptor composite key '%s' (first at line %d)", ck, first)
			} else {
				seen[ck] = d.Line
			}
			if d.ShareThreshold && !strings.Contains(ck, "*") {
				p.errorf(d.Line, "share_threshold can only be used with wildcard values (containing '*'), but found key '%s'", ck)
			}
		}
		if d.RateLimit == nil {
			for _, f := range []struct {
				on   bool
				name string
			}{{d.ShadowMode, "shadow_mode"}, {d.QuotaMode, "quota_mode"}, {d.DetailedMetric, "detailed_metric"}} {
				if f.on {
					p.warnf(d.Line, "%s without a rate_limit has no effect", f.name)
				}
			}
		}
		out = append(out, d)
	}
	return out
}

func (p *parser) rateLimit(m *yaml.Node) *RateLimit {
	rl := &RateLimit{Line: m.Line}
	prs := p.quietPairs(m)
	p.misplaced(prs, rateLimitKeys, "a rate_limit")
	unit, unitLine, hasRPU := "", m.Line, false
	for _, pr := range prs {
		switch pr.key {
		case "unit":
			unit, unitLine = p.str(pr), pr.kline
		case "requests_per_unit":
			rl.RequestsPerUnit, hasRPU = p.uint32(pr), true
		case "unlimited":
			rl.Unlimited = p.boolean(pr)
		case "name":
			rl.Name = p.str(pr)
		case "replaces":
			for _, e := range p.list(pr) {
				eprs := p.quietPairs(e)
				p.misplaced(eprs, replacesKeys, "a replaces entry")
				name := ""
				for _, epr := range eprs {
					if epr.key == "name" {
						name = p.str(epr)
					}
				}
				if name == "" {
					p.errorf(e.Line, "should not have an empty replaces entry")
					continue
				}
				rl.Replaces = append(rl.Replaces, name)
			}
		}
	}
	u, valid := ParseUnit(unit)
	switch {
	case rl.Unlimited && valid:
		p.errorf(unitLine, "should not specify rate limit unit when unlimited (unit '%s')", unit)
	case rl.Unlimited:
		if unit != "" {
			p.warnf(unitLine, "unit '%s' beside unlimited: true is ignored", unit)
		}
		if rl.RequestsPerUnit != 0 {
			p.warnf(rl.Line, "requests_per_unit beside unlimited: true is ignored")
		}
	case unit == "":
		p.errorf(unitLine, "invalid rate limit unit '': rate_limit needs a unit (second, minute, hour, day, week, month, year) or unlimited: true")
	case !valid:
		p.errorf(unitLine, "invalid rate limit unit '%s' (second, minute, hour, day, week, month, year)", unit)
	default:
		rl.Unit = u
		if !hasRPU {
			p.warnf(rl.Line, "rate_limit has no requests_per_unit: a limit of 0 refuses every request")
		}
	}
	for _, r := range rl.Replaces {
		if r == rl.Name {
			p.errorf(rl.Line, "replaces should not contain name of same descriptor ('%s')", r)
		}
	}
	return rl
}

func (p *parser) metadata(m *yaml.Node) map[string]any {
	var v any
	if err := m.Decode(&v); err != nil {
		p.errorf(m.Line, "error parsing metadata: %v", err)
		return nil
	}
	out, _ := stringKeys(v).(map[string]any)
	return out
}

// stringKeys turns every mapping's keys into strings, as envoyproxy/ratelimit does
// before it makes the metadata a protobuf Struct.
func stringKeys(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			t[k] = stringKeys(e)
		}
		return t
	case map[any]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			out[fmt.Sprint(k)] = stringKeys(e)
		}
		return out
	case []any:
		for i, e := range t {
			t[i] = stringKeys(e)
		}
		return t
	}
	return v
}

// checkReplaces warns about a replaces entry naming no rate_limit of the file: it can
// only replace a limit of another file (envoyproxy/ratelimit does not check).
func (p *parser) checkReplaces(cfg *Config) {
	names := map[string]bool{}
	var collect func([]Descriptor)
	collect = func(ds []Descriptor) {
		for i := range ds {
			if rl := ds[i].RateLimit; rl != nil && rl.Name != "" {
				names[rl.Name] = true
			}
			collect(ds[i].Descriptors)
		}
	}
	collect(cfg.Descriptors)
	var check func([]Descriptor)
	check = func(ds []Descriptor) {
		for i := range ds {
			if rl := ds[i].RateLimit; rl != nil {
				for _, r := range rl.Replaces {
					if !names[r] {
						p.warnf(rl.Line, "replaces '%s', a name no rate_limit of this file has", r)
					}
				}
			}
			check(ds[i].Descriptors)
		}
	}
	check(cfg.Descriptors)
}
