package rules

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// jsonRule is one rule in the schema ParseYAML reads (an entry of `rules:`), as JSON: what
// EncodeRule writes and ParseRule reads back.
type jsonRule struct {
	ID        string             `json:"id,omitempty"`
	Match     *jsonMatch         `json:"match,omitempty"`
	By        string             `json:"by,omitempty"`
	Limits    []jsonLimit        `json:"limits"`
	Cost      map[string]int64   `json:"cost,omitempty"`
	Mode      string             `json:"mode,omitempty"`
	FailMode  string             `json:"fail_mode,omitempty"`
	ExpiresAt string             `json:"expires_at,omitempty"`
	Reason    string             `json:"reason,omitempty"`
	Shares    map[string]float64 `json:"shares,omitempty"`
	Unlimited bool               `json:"unlimited,omitempty"`
	Refuse    bool               `json:"refuse,omitempty"`
	Replaces  []string           `json:"replaces,omitempty"`
	Quota     bool               `json:"quota,omitempty"`
	Penalty   *jsonPenalty       `json:"penalty,omitempty"`
	Settle    bool               `json:"settle,omitempty"`
}

type jsonMatch struct {
	APIKey     string          `json:"api_key,omitempty"`
	Plan       string          `json:"plan,omitempty"`
	Org        string          `json:"org,omitempty"`
	Endpoint   string          `json:"endpoint,omitempty"`
	IP         string          `json:"ip,omitempty"`
	Domain     string          `json:"domain,omitempty"`
	Descriptor []jsonDescEntry `json:"descriptor,omitempty"`
}

type jsonDescEntry struct {
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
	Shared bool   `json:"shared,omitempty"`
}

type jsonPenalty struct {
	Refusals int64  `json:"refusals"`
	Within   string `json:"within"`
	Block    string `json:"block"`
}

type jsonLimit struct {
	Name       string  `json:"name"`
	Rate       float64 `json:"rate,omitempty"` // never 0 in a rate limit: omitted for an in-flight one
	Per        string  `json:"per,omitempty"`
	Burst      float64 `json:"burst,omitempty"`
	Concurrent int64   `json:"concurrent,omitempty"`
	Timeout    string  `json:"timeout,omitempty"`
	Quota      int64   `json:"quota,omitempty"`
	Period     string  `json:"period,omitempty"`
	TimeZone   string  `json:"time_zone,omitempty"`
}

// EncodeRule writes r as one JSON mapping in the rule schema: the value of one etcd key
// under the rules prefix (EtcdSource), which ParseRule reads back into an equal Rule.
// Fields at their defaults are left out. It checks nothing: validate the set first.
func EncodeRule(r *Rule) ([]byte, error) {
	j := jsonRule{ID: r.ID, Cost: r.Cost, Reason: r.Reason, Shares: r.Shares, Unlimited: r.Unlimited, Refuse: r.Refuse, Replaces: r.Replaces, Quota: r.Quota, Settle: r.Settle}
	if m := &r.Match; !m.IsZero() {
		j.Match = &jsonMatch{APIKey: m.APIKey, Plan: m.Plan, Org: m.Org, Endpoint: m.Endpoint, IP: m.IP, Domain: m.Domain}
		for _, e := range m.Descriptor {
			j.Match.Descriptor = append(j.Match.Descriptor, jsonDescEntry(e))
		}
	}
	// by is left out when it is the default a reader gives: descriptor for a descriptor
	// rule, api_key for the others.
	def := ByAPIKey
	if len(r.Match.Descriptor) > 0 {
		def = ByDescriptor
	}
	if r.By != def {
		j.By = r.By.String()
	}
	if r.Mode != ModeEnforce {
		j.Mode = r.Mode.String()
	}
	if r.FailMode != FailOpen {
		j.FailMode = r.FailMode.String()
	}
	if !r.ExpiresAt.IsZero() {
		j.ExpiresAt = r.ExpiresAt.UTC().Format(time.RFC3339)
	}
	if p := r.Penalty; p != nil {
		j.Penalty = &jsonPenalty{Refusals: p.Refusals, Within: formatPer(p.Within), Block: formatPer(p.Block)}
	}
	j.Limits = make([]jsonLimit, len(r.Limits)) // [] when unlimited or refuse: the field is always there
	for i, l := range r.Limits {
		if l.IsQuota() {
			j.Limits[i] = jsonLimit{Name: l.Name, Quota: l.Quota, Period: l.Period.String(), TimeZone: l.TimeZone}
			continue
		}
		if l.IsInflight() {
			j.Limits[i] = jsonLimit{Name: l.Name, Concurrent: l.Concurrent, Timeout: formatPer(l.Timeout)}
			continue
		}
		j.Limits[i] = jsonLimit{Name: l.Name, Rate: l.Rate, Per: formatPer(l.Per), Burst: l.Burst}
	}
	return json.MarshalIndent(j, "", "  ") // one field a line: errors name lines usefully
}

// yamlSet and yamlRule are a set in the rule file schema as YAML: what EncodeSet writes.
type yamlSet struct {
	Version string     `yaml:"version,omitempty"`
	Rules   []yamlRule `yaml:"rules"`
}

type yamlRule struct {
	ID        string             `yaml:"id"`
	Match     *yamlMatch         `yaml:"match,omitempty"`
	By        string             `yaml:"by,omitempty"`
	Limits    []yamlLimit        `yaml:"limits,omitempty"`
	Unlimited bool               `yaml:"unlimited,omitempty"`
	Refuse    bool               `yaml:"refuse,omitempty"`
	Replaces  []string           `yaml:"replaces,omitempty,flow"`
	Quota     bool               `yaml:"quota,omitempty"`
	Settle    bool               `yaml:"settle,omitempty"`
	Cost      map[string]int64   `yaml:"cost,omitempty"`
	Mode      string             `yaml:"mode,omitempty"`
	FailMode  string             `yaml:"fail_mode,omitempty"`
	ExpiresAt string             `yaml:"expires_at,omitempty"`
	Reason    string             `yaml:"reason,omitempty"`
	Shares    map[string]float64 `yaml:"shares,omitempty"`
	Penalty   *yamlPenalty       `yaml:"penalty,omitempty,flow"`
}

type yamlPenalty struct {
	Refusals int64  `yaml:"refusals"`
	Within   string `yaml:"within"`
	Block    string `yaml:"block"`
}

type yamlMatch struct {
	APIKey     string          `yaml:"api_key,omitempty"`
	Plan       string          `yaml:"plan,omitempty"`
	Org        string          `yaml:"org,omitempty"`
	Endpoint   string          `yaml:"endpoint,omitempty"`
	IP         string          `yaml:"ip,omitempty"`
	Domain     string          `yaml:"domain,omitempty"`
	Descriptor []yamlDescEntry `yaml:"descriptor,omitempty"`
}

type yamlDescEntry struct {
	Key    string `yaml:"key"`
	Value  string `yaml:"value,omitempty"`
	Shared bool   `yaml:"shared,omitempty"`
}

type yamlLimit struct {
	Name       string  `yaml:"name"`
	Rate       float64 `yaml:"rate,omitempty"`
	Per        string  `yaml:"per,omitempty"`
	Burst      float64 `yaml:"burst,omitempty"`
	Concurrent int64   `yaml:"concurrent,omitempty"`
	Timeout    string  `yaml:"timeout,omitempty"`
	Quota      int64   `yaml:"quota,omitempty"`
	Period     string  `yaml:"period,omitempty"`
	TimeZone   string  `yaml:"time_zone,omitempty"`
}

// EncodeSet writes s as a rule file (YAML) that LoadFile and ParseYAML read back into the
// same rules: what `enforcer rules import` prints. Fields at their defaults are left out,
// each descriptor entry and limit is one line. It checks nothing: compile the set first.
func EncodeSet(s *Set) []byte {
	out := yamlSet{Version: s.Version, Rules: make([]yamlRule, len(s.Rules))}
	for i := range s.Rules {
		r := &s.Rules[i]
		// EncodeRule's JSON is the one place defaults are left out; read it back as YAML.
		j, err := EncodeRule(r)
		if err == nil {
			var jr jsonRule
			if err = json.Unmarshal(j, &jr); err == nil {
				out.Rules[i] = yamlRuleOf(&jr)
			}
		}
		if err != nil { // a time json refuses (year > 9999): say it where the rule goes
			out.Rules[i] = yamlRule{ID: r.ID, Reason: "cannot encode: " + err.Error()}
		}
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	_ = enc.Encode(out) // plain structs of strings, numbers and maps: never fails
	_ = enc.Close()
	// One descriptor entry or limit a line: flow mappings inside the block lists.
	return flowLeaves(b.Bytes())
}

func yamlRuleOf(j *jsonRule) yamlRule {
	y := yamlRule{ID: j.ID, By: j.By, Unlimited: j.Unlimited, Refuse: j.Refuse, Replaces: j.Replaces, Quota: j.Quota, Settle: j.Settle, Cost: j.Cost,
		Mode: j.Mode, FailMode: j.FailMode, ExpiresAt: j.ExpiresAt, Reason: j.Reason, Shares: j.Shares}
	if m := j.Match; m != nil {
		y.Match = &yamlMatch{APIKey: m.APIKey, Plan: m.Plan, Org: m.Org, Endpoint: m.Endpoint, IP: m.IP, Domain: m.Domain}
		for _, e := range m.Descriptor {
			y.Match.Descriptor = append(y.Match.Descriptor, yamlDescEntry(e))
		}
	}
	for _, l := range j.Limits {
		y.Limits = append(y.Limits, yamlLimit(l))
	}
	if p := j.Penalty; p != nil {
		y.Penalty = &yamlPenalty{Refusals: p.Refusals, Within: p.Within, Block: p.Block}
	}
	return y
}

// flowLeaves rewrites each list item that is a mapping of scalars (a descriptor entry, a
// limit) as one flow mapping line: "- {key: k, value: v}".
func flowLeaves(in []byte) []byte {
	var doc yaml.Node
	if err := yaml.Unmarshal(in, &doc); err != nil {
		return in
	}
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		if n.Kind == yaml.SequenceNode {
			for _, c := range n.Content {
				if c.Kind == yaml.MappingNode && scalarsOnly(c) {
					c.Style = yaml.FlowStyle
				}
			}
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(&doc)
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return in
	}
	_ = enc.Close()
	return b.Bytes()
}

func scalarsOnly(m *yaml.Node) bool {
	for _, c := range m.Content {
		if c.Kind != yaml.ScalarNode {
			return false
		}
	}
	return true
}

// formatPer writes a period the way rule files do: "1s", "1m", "1h30m" (not "1m0s").
func formatPer(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// ParseRuleAt is ParseRule for the value of etcd key (or any named source): errors name
// key as the file, the way an EtcdSource reports them.
func ParseRuleAt(data []byte, key string) (*Rule, error) { return parseRule(data, key) }

// EtcdSet is the set the values under prefix (key → value) make over base (nil: none)
// when every one is good: base rules first, an etcd rule replacing the base rule of its
// id, the other etcd rules after in key order; a rule without an id takes the key's name
// after the prefix. Every value that does not parse is an error (all listed). An
// EtcdSource refuses bad keys alone instead; CheckEtcd checks values its way.
func EtcdSet(prefix string, kvs map[string][]byte, base *Set) (*Set, error) {
	return layer(base, sortedKeys(kvs), func(k string) (*Rule, error) {
		r, err := parseRule(kvs[k], k)
		if err == nil && r.ID == "" {
			r.ID = strings.TrimPrefix(strings.TrimPrefix(k, prefix), "/")
		}
		return r, err
	})
}

// CheckEtcd checks the values under prefix (key → value) the way every EtcdSource does:
// each key's rule alone (parsed, validated and compiled for opt as a set of one), a key
// repeating the id of a key before it in key order refused too, then the good rules
// layered over base (as EtcdSet) and compiled whole. It returns the error of each refused
// key (an enforcer refuses those alone and applies the rest) and the error of the whole
// set, which only a set-wide limit (MaxRules) or a bad base can cause. The balancer's
// admin API refuses a change that would leave a key it writes refused, or the whole set
// bad, while a bad key it does not touch (written with etcdctl) blocks nothing.
func CheckEtcd(prefix string, kvs map[string][]byte, base *Set, opt CompileOptions) (refused map[string]error, err error) {
	refused = map[string]error{}
	ids := map[string]string{} // rule id → key holding it
	good := map[string]*Rule{}
	var keys []string
	for _, k := range sortedKeys(kvs) {
		r, err := parseRule(kvs[k], k)
		if err == nil && r.ID == "" {
			r.ID = strings.TrimPrefix(strings.TrimPrefix(k, prefix), "/")
		}
		if err == nil {
			_, err = Compile(&Set{Rules: []Rule{*r}}, opt)
		}
		if err == nil {
			if other, dup := ids[r.ID]; dup {
				err = &Error{File: k, Rule: r.ID, Field: "id", Msg: fmt.Sprintf("%q is also the id of the rule at %s; ids must be unique", r.ID, other)}
			}
		}
		if err != nil {
			refused[k] = err
			continue
		}
		ids[r.ID] = k
		good[k] = r
		keys = append(keys, k)
	}
	set, err := layer(base, keys, func(k string) (*Rule, error) { return good[k], nil })
	if err == nil {
		_, err = Compile(set, opt)
	}
	return refused, err
}

// layer is base's rules, then each key's rule in keys order, an etcd rule replacing the
// base rule of its id (a second etcd rule of that id is a duplicate, which Validate
// reports). Every rule that failed to parse is an error. EtcdSource and EtcdSet both
// build their sets here.
func layer(base *Set, keys []string, rule func(key string) (*Rule, error)) (*Set, error) {
	var errs errList
	set := &Set{}
	byID := map[string]int{} // base rule id → index, until an etcd rule replaces it
	if base != nil {
		set.Rules = append(set.Rules, base.Rules...)
		for i, r := range set.Rules {
			byID[r.ID] = i
		}
	}
	for _, k := range keys {
		r, err := rule(k)
		if err != nil {
			errs.add(err)
			continue
		}
		if i, ok := byID[r.ID]; ok {
			set.Rules[i] = *r
			delete(byID, r.ID)
			continue
		}
		set.Rules = append(set.Rules, *r)
	}
	if err := errs.err(); err != nil {
		return nil, err
	}
	return set, nil
}
