package rules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Limits on what a rule file or etcd value may hold; larger input is an error, not a slow
// start.
const (
	// MaxFileSize is the largest rule file or etcd value LoadFile and ParseYAML accept.
	MaxFileSize = 32 << 20
	// MaxRules is the most rules one set may hold.
	MaxRules = 200_000
)

// The YAML schema. Every field is decoded strictly (KnownFields): an unknown field is an
// error, and so is a value of the wrong type.
type rawSet struct {
	Version string    `yaml:"version"`
	Rules   []rawRule `yaml:"rules"`
}

type rawRule struct {
	ID        string             `yaml:"id"`
	Match     rawMatch           `yaml:"match"`
	By        string             `yaml:"by"`
	Limits    []rawLimit         `yaml:"limits"`
	Cost      map[string]float64 `yaml:"cost"` // float so 1.5 is an error, not a silent 1
	Mode      string             `yaml:"mode"`
	FailMode  string             `yaml:"fail_mode"`
	ExpiresAt string             `yaml:"expires_at"`
	Reason    string             `yaml:"reason"`
	Shares    map[string]float64 `yaml:"shares"`
	Unlimited bool               `yaml:"unlimited"`
	Refuse    bool               `yaml:"refuse"`
	Replaces  []string           `yaml:"replaces"`
	Quota     bool               `yaml:"quota"`
	Penalty   *rawPenalty        `yaml:"penalty"`
	Settle    bool               `yaml:"settle"`
}

type rawPenalty struct {
	Refusals float64 `yaml:"refusals"` // float so 1.5 is an error, not a silent 1
	Within   string  `yaml:"within"`
	Block    string  `yaml:"block"`
}

type rawMatch struct {
	APIKey     string         `yaml:"api_key"`
	Plan       string         `yaml:"plan"`
	Org        string         `yaml:"org"`
	Endpoint   string         `yaml:"endpoint"`
	IP         string         `yaml:"ip"`
	Domain     string         `yaml:"domain"`
	Descriptor []rawDescEntry `yaml:"descriptor"`
}

type rawDescEntry struct {
	Key    string `yaml:"key"`
	Value  string `yaml:"value"`
	Shared bool   `yaml:"shared"`
}

type rawLimit struct {
	Name       string  `yaml:"name"`
	Rate       float64 `yaml:"rate"`
	Per        string  `yaml:"per"`
	Burst      float64 `yaml:"burst"`
	Concurrent float64 `yaml:"concurrent"`
	Timeout    string  `yaml:"timeout"`
	Quota      float64 `yaml:"quota"`
	Period     string  `yaml:"period"`
	TimeZone   string  `yaml:"time_zone"`
}

// rulePos is where a rule was written: its first line and the line of each field
// ("limits[0].rate" → 14). Lines are 1-based and relative to the parsed text.
type rulePos struct {
	file   string
	line   int
	fields map[string]int
}

func (p *rulePos) lineOf(field string) int {
	if p == nil {
		return 0
	}
	// The field itself, else its nearest parent ("limits[0].rate" → "limits[0]" → "limits").
	for f := field; f != ""; {
		if l, ok := p.fields[f]; ok {
			return l
		}
		i := strings.LastIndexAny(f, ".[")
		if i < 0 {
			break
		}
		f = f[:i]
	}
	return p.line
}

// ParseYAML parses a rule set written in YAML (or JSON, which YAML includes):
//
//	version: "2024-06-01.1"        # optional; else the snapshot is named by a content hash
//	rules:
//	  - id: pro-search
//	    match: {plan: pro, endpoint: "GET /v1/search"}
//	    by: api_key                # api_key (default) | ip | org | endpoint | global
//	    limits:
//	      - {name: second, rate: 100, per: 1s, burst: 200}
//	      - {name: minute, rate: 5000, per: 1m}
//	      - {name: inflight, concurrent: 20, timeout: 30s}  # at most 20 in flight at once
//	      - {name: daily, quota: 10000, period: day, time_zone: Europe/Paris}  # a calendar quota
//	    cost: {"GET /v1/search": 2}
//	    mode: enforce              # enforce (default) | shadow
//	    fail_mode: open            # open (default) | closed
//	    expires_at: 2024-07-01T00:00:00Z   # RFC 3339; mandatory when match.api_key is set
//	    reason: "launch week"
//	    shares: {us-east: 0.5, eu-west: 0.3, ap-south: 0.2}
//	    penalty: {refusals: 1000, within: 1m, block: 10m}   # refused 1,000 times in a minute → refused for 10 minutes
//	  - id: marketing-sms                # a descriptor rule (Envoy RLS; see the package doc)
//	    match:
//	      domain: messaging
//	      descriptor:                    # entries in order; value: exact, wildcard (*) or absent (any)
//	        - {key: message_type, value: marketing}
//	        - {key: to_number}
//	    by: descriptor                   # the default with a descriptor: each distinct descriptor its own bucket
//	    limits: [{name: day, rate: 5, per: 24h}]
//	    replaces: [sms-default]          # rules that then do not apply to the request
//	    quota: true                      # Envoy RLS: refuses the request only with the others (quota_mode)
//	  - id: llm-tokens-done
//	    match: {domain: llm, descriptor: [{key: api_key}, {key: phase, value: done}]}
//	    limits: [{name: minute, rate: 100000, per: 1m}]
//	    settle: true                     # hits are costs settled after the response: never refused, may leave a debt
//	  - id: internal
//	    match: {domain: internal, descriptor: [{key: ldap}]}
//	    unlimited: true                  # no limits: what it wins is not limited
//	  - id: blocked
//	    match: {domain: edge, descriptor: [{key: remote_address, value: 50.0.0.5}]}
//	    refuse: true                     # no limits: what it wins is refused
//
// It is strict: unknown fields, wrong types, a second document, unknown words for mode,
// fail_mode and by, bad durations, times and IPs are errors. Each error wraps ErrInvalid and
// names the rule, the field and the line. ParseYAML checks form only; Compile (or
// Set.Validate) checks the values.
func ParseYAML(data []byte) (*Set, error) { return parseSet(data, "") }

// LoadFile reads and parses a rule file (see ParseYAML); errors name the file.
func LoadFile(path string) (*Set, error) {
	data, err := readFileLimited(path)
	if err != nil {
		return nil, err
	}
	return parseSet(data, path)
}

// CheckFile loads, validates and compiles the rule file at path the way an enforcer would,
// and returns every error found (nil if the file is good). It backs `enforcer rules check`.
func CheckFile(path string) error {
	data, err := readFileLimited(path)
	if err != nil {
		return err
	}
	return CheckYAML(data, path, CompileOptions{})
}

// CheckYAML parses, validates and compiles a rule file's content for opt, naming file in
// every error: CheckFile's check, for content that did not come from a file (the
// balancer's admin API dry run).
func CheckYAML(data []byte, file string, opt CompileOptions) error {
	s, err := parseSet(data, file)
	if err != nil {
		return err
	}
	_, err = Compile(s, opt)
	return err
}

// ParseYAMLAt is ParseYAML naming file in every error.
func ParseYAMLAt(data []byte, file string) (*Set, error) { return parseSet(data, file) }

// ParseRule parses one rule written alone (an etcd value: a YAML or JSON mapping with the
// fields of one entry of `rules:`). Errors name the rule, field and line, like ParseYAML.
func ParseRule(data []byte) (*Rule, error) { return parseRule(data, "") }

func readFileLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("rules: while opening rule file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("rules: while reading %s: %w", path, err)
	}
	if len(data) > MaxFileSize {
		return nil, &Error{File: path, Msg: fmt.Sprintf("file is larger than %d bytes", MaxFileSize)}
	}
	return data, nil
}

func parseSet(data []byte, file string) (*Set, error) {
	if len(data) > MaxFileSize {
		return nil, &Error{File: file, Msg: fmt.Sprintf("input is %d bytes, more than %d", len(data), MaxFileSize)}
	}
	var raw rawSet
	root, err := decodeStrict(data, &raw)
	var ruleNodes []*yaml.Node
	if root != nil {
		ruleNodes = ruleSeq(root)
	}
	if err != nil {
		return nil, decodeError(err, file, ruleNodes, "")
	}
	if len(raw.Rules) > MaxRules {
		return nil, &Error{File: file, Msg: fmt.Sprintf("%d rules, more than %d", len(raw.Rules), MaxRules)}
	}
	s := &Set{Version: raw.Version, Rules: make([]Rule, len(raw.Rules)), file: file}
	var errs errList
	for i := range raw.Rules {
		var n *yaml.Node
		if i < len(ruleNodes) {
			n = ruleNodes[i]
		}
		pos := positions(n, file)
		errs.add(convertRule(&raw.Rules[i], i, pos, &s.Rules[i]))
	}
	if err := errs.err(); err != nil {
		return nil, err
	}
	return s, nil
}

func parseRule(data []byte, file string) (*Rule, error) {
	if len(data) > MaxFileSize {
		return nil, &Error{File: file, Msg: fmt.Sprintf("input is %d bytes, more than %d", len(data), MaxFileSize)}
	}
	var raw rawRule
	root, err := decodeStrict(data, &raw)
	var nodes []*yaml.Node
	if root != nil && root.Kind == yaml.MappingNode {
		nodes = []*yaml.Node{root}
	}
	if err != nil {
		return nil, decodeError(err, file, nodes, "")
	}
	var r Rule
	var n *yaml.Node
	if len(nodes) > 0 {
		n = nodes[0]
	}
	if err := convertRule(&raw, 0, positions(n, file), &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// decodeStrict decodes exactly one YAML document into v with unknown fields refused, and
// returns the document's top node (nil if there is none) for positions.
func decodeStrict(data []byte, v any) (*yaml.Node, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	var root *yaml.Node
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		root = doc.Content[0]
	}
	if root == nil {
		return nil, errors.New("empty document")
	}
	d := yaml.NewDecoder(bytes.NewReader(data))
	d.KnownFields(true)
	if err := d.Decode(v); err != nil {
		return root, err
	}
	var extra yaml.Node
	if err := d.Decode(&extra); err != io.EOF {
		if err == nil {
			return root, fmt.Errorf("line %d: a second YAML document; a rule set is one document", extra.Line)
		}
		return root, err
	}
	return root, nil
}

// ruleSeq returns the mapping nodes of the `rules:` sequence of a set's top node.
func ruleSeq(root *yaml.Node) []*yaml.Node {
	if root.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "rules" && root.Content[i+1].Kind == yaml.SequenceNode {
			return root.Content[i+1].Content
		}
	}
	return nil
}

// positions records the line of each field of a rule mapping node.
func positions(n *yaml.Node, file string) *rulePos {
	p := &rulePos{file: file, fields: map[string]int{}}
	if n == nil {
		return p
	}
	p.line = n.Line
	var walk func(n *yaml.Node, prefix string)
	walk = func(n *yaml.Node, prefix string) {
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				f := k.Value
				if prefix != "" {
					f = prefix + "." + k.Value
				}
				if _, dup := p.fields[f]; !dup {
					p.fields[f] = k.Line
				}
				if prefix == "" || strings.HasPrefix(prefix, "limits[") || prefix == "match" {
					walk(v, f) // cost and shares keys are data, not fields: stop there
				}
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				f := fmt.Sprintf("%s[%d]", prefix, i)
				p.fields[f] = c.Line
				walk(c, f)
			}
		}
	}
	walk(n, "")
	return p
}

// ruleID returns the id written in a rule mapping node, if any.
func ruleID(n *yaml.Node) string {
	if n == nil || n.Kind != yaml.MappingNode {
		return ""
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == "id" && n.Content[i+1].Kind == yaml.ScalarNode {
			return n.Content[i+1].Value
		}
	}
	return ""
}

var (
	lineRE     = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)
	notFoundRE = regexp.MustCompile(`^field (\S+) not found in type \S+$`)
	typeNames  = strings.NewReplacer(
		"[]rules.rawRule", "a list of rules", "rules.rawRule", "a rule (a mapping)",
		"rules.rawSet", "a rule set (a mapping with version and rules)",
		"rules.rawMatch", "a match (a mapping)",
		"[]rules.rawLimit", "a list of limits", "rules.rawLimit", "a limit (a mapping)",
		"[]rules.rawDescEntry", "a list of descriptor entries", "rules.rawDescEntry", "a descriptor entry (a mapping with key and value)",
		"map[string]float64", "a mapping of names to numbers", "[]string", "a list of rule ids",
	)
)

// decodeError turns a yaml error into Errors that name the rule and field where the line
// says which.
func decodeError(err error, file string, rules []*yaml.Node, _ string) error {
	var msgs []string
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msgs = te.Errors
	} else {
		msgs = []string{err.Error()}
	}
	var errs errList
	for _, m := range msgs {
		e := &Error{File: file, Msg: typeNames.Replace(m)}
		if sm := lineRE.FindStringSubmatch(m); sm != nil {
			e.Line, _ = strconv.Atoi(sm[1])
			e.Msg = typeNames.Replace(sm[2])
			if fm := notFoundRE.FindStringSubmatch(sm[2]); fm != nil {
				e.Msg = fmt.Sprintf("unknown field %q", fm[1])
			}
		}
		if e.Line > 0 && len(rules) > 0 {
			// The rule is the last one starting at or before the line.
			i := sort.Search(len(rules), func(i int) bool { return rules[i].Line > e.Line }) - 1
			if i >= 0 {
				e.Index, e.Rule = i, ruleID(rules[i])
				e.Field = fieldAtLine(positions(rules[i], file), e.Line)
			}
		}
		errs.add(e)
	}
	return errs.err()
}

// fieldAtLine names the deepest field written on line, if one is.
func fieldAtLine(p *rulePos, line int) string {
	best := ""
	for f, l := range p.fields {
		if l == line && (len(f) > len(best) || (len(f) == len(best) && f < best)) {
			best = f
		}
	}
	return best
}

var modeWords = map[string]Mode{"": ModeEnforce, "enforce": ModeEnforce, "shadow": ModeShadow}
var failWords = map[string]FailMode{"": FailOpen, "open": FailOpen, "closed": FailClosed}
var byWords = map[string]By{"": ByAPIKey, "api_key": ByAPIKey, "ip": ByIP, "org": ByOrg, "endpoint": ByEndpoint, "global": ByGlobal, "descriptor": ByDescriptor}

// convertRule checks the form of one raw rule and fills r. Values (bounds, uniqueness) are
// Validate's job.
func convertRule(raw *rawRule, index int, pos *rulePos, r *Rule) error {
	var errs errList
	bad := func(field, format string, a ...any) {
		errs.add(&Error{File: pos.file, Line: pos.lineOf(field), Rule: raw.ID, Index: index, Field: field, Msg: fmt.Sprintf(format, a...)})
	}
	m := raw.Match
	*r = Rule{
		ID:        raw.ID,
		Match:     Match{APIKey: m.APIKey, Plan: m.Plan, Org: m.Org, Endpoint: m.Endpoint, IP: m.IP, Domain: m.Domain},
		Reason:    raw.Reason,
		Shares:    raw.Shares,
		Unlimited: raw.Unlimited,
		Refuse:    raw.Refuse,
		Replaces:  raw.Replaces,
		Quota:     raw.Quota,
		Settle:    raw.Settle,
		pos:       pos,
	}
	if len(m.Descriptor) > 0 {
		r.Match.Descriptor = make([]DescriptorEntry, len(m.Descriptor))
		for i, e := range m.Descriptor {
			r.Match.Descriptor[i] = DescriptorEntry(e)
		}
	}
	var ok bool
	if r.Mode, ok = modeWords[raw.Mode]; !ok {
		bad("mode", "%q, want enforce or shadow", raw.Mode)
	}
	if r.FailMode, ok = failWords[raw.FailMode]; !ok {
		bad("fail_mode", "%q, want open or closed", raw.FailMode)
	}
	if r.By, ok = byWords[raw.By]; !ok {
		bad("by", "%q, want api_key, ip, org, endpoint, global or descriptor", raw.By)
	} else if raw.By == "" && len(m.Descriptor) > 0 {
		r.By = ByDescriptor // a descriptor rule counts each descriptor, as envoyproxy/ratelimit does
	}
	if raw.ExpiresAt != "" {
		t, err := time.Parse(time.RFC3339, raw.ExpiresAt)
		if err != nil {
			bad("expires_at", "%q is not an RFC 3339 time (like 2024-07-01T00:00:00Z)", raw.ExpiresAt)
		}
		r.ExpiresAt = t
	}
	if raw.Match.IP != "" {
		if _, err := parseIPMatch(raw.Match.IP); err != nil {
			bad("match.ip", "%v", err)
		}
	}
	if raw.Penalty != nil {
		r.Penalty = parsePenalty(raw.Penalty, bad)
	}
	r.Limits = make([]LimitSpec, len(raw.Limits))
	for i, l := range raw.Limits {
		r.Limits[i] = LimitSpec{Name: l.Name, Rate: l.Rate, Burst: l.Burst}
		if l.Quota != 0 || l.Period != "" || l.TimeZone != "" {
			parseQuota(&r.Limits[i], l, i, bad)
			continue
		}
		if l.Concurrent != 0 || l.Timeout != "" {
			parseInflight(&r.Limits[i], l, i, bad)
			continue
		}
		if l.Per == "" {
			bad(fmt.Sprintf("limits[%d].per", i), "missing (a duration like 1s or 1m)")
			continue
		}
		d, err := time.ParseDuration(l.Per)
		if err != nil {
			bad(fmt.Sprintf("limits[%d].per", i), "%q is not a duration (like 1s, 1m, 24h)", l.Per)
		}
		r.Limits[i].Per = d
	}
	if len(raw.Cost) > 0 {
		r.Cost = make(map[string]int64, len(raw.Cost))
		for _, ep := range sortedKeys(raw.Cost) {
			c := raw.Cost[ep]
			if c != math.Trunc(c) || c < 1 || c > math.MaxInt32 {
				bad("cost", "endpoint %q: %g, want a whole number of tokens >= 1", ep, c)
				continue
			}
			r.Cost[ep] = int64(c)
		}
	}
	return errs.err()
}

// parseIPMatch parses an address or prefix; IPv4-mapped IPv6 forms become IPv4 and the
// prefix is masked.
func parseIPMatch(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not an IP prefix like 10.0.0.0/8 or 2001:db8::/48", s)
		}
		a, bits := p.Addr(), p.Bits()
		if a.Is4In6() {
			if bits < 96 {
				return netip.Prefix{}, fmt.Errorf("%q: an IPv4-mapped prefix needs at least /96", s)
			}
			a, bits = a.Unmap(), bits-96
		}
		return netip.PrefixFrom(a, bits).Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("%q is not an IP address or prefix", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// parsePenalty reads a rule's penalty ({refusals, within, block}); Validate checks the
// values.
func parsePenalty(raw *rawPenalty, bad func(field, format string, a ...any)) *PenaltySpec {
	p := &PenaltySpec{}
	if raw.Refusals != math.Trunc(raw.Refusals) || math.Abs(raw.Refusals) > 1e15 {
		bad("penalty.refusals", "%g, want a whole number of refusals", raw.Refusals)
	} else {
		p.Refusals = int64(raw.Refusals)
	}
	for _, f := range []struct {
		name, v string
		d       *time.Duration
	}{{"within", raw.Within, &p.Within}, {"block", raw.Block, &p.Block}} {
		if f.v == "" {
			bad("penalty."+f.name, "missing (a duration like 1m or 10m)")
			continue
		}
		d, err := time.ParseDuration(f.v)
		if err != nil {
			bad("penalty."+f.name, "%q is not a duration (like 1m, 10m)", f.v)
			continue
		}
		*f.d = d
	}
	return p
}

// parseInflight reads an in-flight limit ({name, concurrent, timeout}); Validate checks
// the values.
func parseInflight(spec *LimitSpec, l rawLimit, i int, bad func(field, format string, a ...any)) {
	f := func(s string) string { return fmt.Sprintf("limits[%d].%s", i, s) }
	if l.Concurrent != math.Trunc(l.Concurrent) || math.Abs(l.Concurrent) > 1e15 {
		bad(f("concurrent"), "%g, want a whole number of requests", l.Concurrent)
	} else {
		spec.Concurrent = int64(l.Concurrent) // Validate checks the range
	}
	if l.Per != "" {
		bad(f("per"), "%q beside concurrent; an in-flight limit has concurrent and timeout only", l.Per)
	}
	if l.Timeout == "" {
		bad(f("timeout"), "missing (a duration like 30s: how long a request holds its slot if its release is lost)")
		return
	}
	d, err := time.ParseDuration(l.Timeout)
	if err != nil {
		bad(f("timeout"), "%q is not a duration (like 30s, 2m)", l.Timeout)
		return
	}
	spec.Timeout = d
}

// parseQuota reads a calendar quota ({name, quota, period, time_zone}); Validate checks
// the values and loads the zone.
func parseQuota(spec *LimitSpec, l rawLimit, i int, bad func(field, format string, a ...any)) {
	f := func(s string) string { return fmt.Sprintf("limits[%d].%s", i, s) }
	if l.Quota != math.Trunc(l.Quota) || math.Abs(l.Quota) > 1e15 {
		bad(f("quota"), "%g, want a whole number of tokens", l.Quota)
	} else {
		spec.Quota = int64(l.Quota) // Validate checks the range
	}
	if l.Per != "" || l.Concurrent != 0 || l.Timeout != "" {
		bad(f("quota"), "beside per, concurrent or timeout; a calendar quota has quota, period and time_zone only")
	}
	spec.TimeZone = l.TimeZone
	if l.Period == "" {
		bad(f("period"), "missing (day, week or month)")
		return
	}
	p, ok := ParsePeriod(l.Period)
	if !ok {
		bad(f("period"), "%.40q, want day, week (ISO, from Monday) or month", l.Period)
		return
	}
	spec.Period = p
}
