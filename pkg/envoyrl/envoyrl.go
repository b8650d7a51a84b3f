// Package envoyrl loads envoyproxy/ratelimit's YAML configuration files strictly into a
// model (issue 23, §2's first bullet). Nothing serves the model yet.
//
// The rules mirror envoyproxy/ratelimit's loader (src/config/config_impl.go): a file it
// rejects, Parse rejects, naming file and line and every problem of the file at once,
// not only the first. Where envoyproxy/ratelimit accepts a file but silently ignores or
// overrides part of it (a known key where it has no meaning, a duplicated mapping key, a
// unit beside unlimited: true, ...), Parse accepts the file too, so the switch stays a
// change of image, and says so in Config.Warnings.
package envoyrl

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// ErrInvalid is wrapped by every error Parse, LoadDir and LoadDirMerged report.
var ErrInvalid = errors.New("invalid envoyproxy/ratelimit configuration")

// Error is one problem of a file, at a line (0 when the line is unknown).
type Error struct {
	File string
	Line int
	Msg  string
}

func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.File, e.Msg)
}

// Is makes errors.Is(err, ErrInvalid) hold.
func (e *Error) Is(target error) bool { return target == ErrInvalid }

// Config is one file: one domain and its descriptor tree.
type Config struct {
	Domain      string
	Descriptors []Descriptor
	// File is the name the file was parsed under (for a merged domain, the first file).
	File string
	// Line is the line of the domain key (0 when absent).
	Line int
	// Warnings name what envoyproxy/ratelimit accepts but ignores, "file:line: ...".
	Warnings []string
}

// Descriptor is one entry of a descriptors list.
type Descriptor struct {
	Key string
	// Value is optional; empty matches any value of Key.
	Value     string
	RateLimit *RateLimit
	// Descriptors are the nested entries.
	Descriptors    []Descriptor
	ShadowMode     bool
	QuotaMode      bool
	DetailedMetric bool
	ValueToMetric  bool
	ShareThreshold bool
	// Metadata is arbitrary; envoyproxy/ratelimit returns it with the descriptor's status.
	Metadata map[string]any
	File     string
	Line     int
}

// CompositeKey is the key envoyproxy/ratelimit files a descriptor under at its level:
// key, or key_value when a value is given. Two entries of one level must differ in it.
func (d *Descriptor) CompositeKey() string {
	if d.Value == "" {
		return d.Key
	}
	return d.Key + "_" + d.Value
}

// RateLimit is a descriptor's rate_limit block.
type RateLimit struct {
	// Unit is UnitUnknown when Unlimited.
	Unit            Unit
	RequestsPerUnit uint32
	Unlimited       bool
	Name            string
	Replaces        []string
	Line            int
}

// Unit is a rate_limit unit; the values are those of envoy's RateLimitResponse.RateLimit.Unit.
type Unit int

const (
	UnitUnknown Unit = 0
	UnitSecond  Unit = 1
	UnitMinute  Unit = 2
	UnitHour    Unit = 3
	UnitDay     Unit = 4
	UnitMonth   Unit = 5
	UnitYear    Unit = 6
	UnitWeek    Unit = 7
)

var unitNames = map[string]Unit{
	"second": UnitSecond, "minute": UnitMinute, "hour": UnitHour, "day": UnitDay,
	"week": UnitWeek, "month": UnitMonth, "year": UnitYear,
}

// ParseUnit reads a unit as envoyproxy/ratelimit does: case-insensitively, one of
// second, minute, hour, day, week, month, year.
func ParseUnit(s string) (Unit, bool) {
	u, ok := unitNames[strings.ToLower(s)]
	return u, ok
}

func (u Unit) String() string {
	for n, v := range unitNames {
		if v == u {
			return n
		}
	}
	return "unknown"
}

// Duration is the unit's length as envoyproxy/ratelimit counts it (a month is 30 days, a
// year 365); 0 for UnitUnknown.
func (u Unit) Duration() time.Duration {
	const day = 24 * time.Hour
	switch u {
	case UnitSecond:
		return time.Second
	case UnitMinute:
		return time.Minute
	case UnitHour:
		return time.Hour
	case UnitDay:
		return day
	case UnitWeek:
		return 7 * day
	case UnitMonth:
		return 30 * day
	case UnitYear:
		return 365 * day
	}
	return 0
}

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

// LoadDir loads every *.yaml and *.yml file of dir (not its subdirectories, not dot
// files), in name order, each one domain: a domain in two files is an error, as in
// envoyproxy/ratelimit by default (MERGE_DOMAIN_CONFIG=false). The runtime layout's
// directory is RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config.
func LoadDir(dir string) ([]*Config, error) { return loadDir(dir, false) }

// LoadDirMerged is LoadDir with envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG=true: the
// files of one domain become one Config (in the first file's name), whose top-level
// descriptors must still differ in composite key.
func LoadDirMerged(dir string) ([]*Config, error) { return loadDir(dir, true) }

func loadDir(dir string, merge bool) ([]*Config, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, &Error{File: dir, Msg: err.Error()}
	}
	var names []string
	for _, e := range ents {
		n := e.Name()
		ext := filepath.Ext(n)
		if strings.HasPrefix(n, ".") || (ext != ".yaml" && ext != ".yml") {
			continue
		}
		if !e.Type().IsRegular() {
			if fi, err := os.Stat(filepath.Join(dir, n)); err != nil || !fi.Mode().IsRegular() {
				continue
			}
		}
		names = append(names, n)
	}
	sort.Strings(names)
	var (
		errs  []error
		out   []*Config
		byDom = map[string]*Config{}
	)
	for _, n := range names {
		path := filepath.Join(dir, n)
		data, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, &Error{File: path, Msg: err.Error()})
			continue
		}
		cfg, err := Parse(path, data)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		first, dup := byDom[cfg.Domain]
		switch {
		case !dup:
			byDom[cfg.Domain] = cfg
			out = append(out, cfg)
		case !merge:
			errs = append(errs, &Error{File: path, Line: cfg.Line, Msg: fmt.Sprintf(
				"duplicate domain '%s' in config file (also in %s:%d; envoyproxy/ratelimit merges them only with MERGE_DOMAIN_CONFIG=true)",
				cfg.Domain, first.File, first.Line)})
		default:
			have := map[string]*Descriptor{}
			for i := range first.Descriptors {
				have[first.Descriptors[i].CompositeKey()] = &first.Descriptors[i]
			}
			for _, d := range cfg.Descriptors {
				if prev, ok := have[d.CompositeKey()]; ok {
					errs = append(errs, &Error{File: path, Line: d.Line, Msg: fmt.Sprintf(
						"duplicate descriptor composite key '%s.%s' (also in %s:%d)",
						cfg.Domain, d.CompositeKey(), prev.File, prev.Line)})
					continue
				}
				first.Descriptors = append(first.Descriptors, d)
				have[d.CompositeKey()] = &first.Descriptors[len(first.Descriptors)-1]
			}
			first.Warnings = append(first.Warnings, cfg.Warnings...)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}
