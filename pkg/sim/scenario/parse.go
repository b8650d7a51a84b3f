package scenario

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"sort"
	"strconv"
	"time"

	"gopkg.in/yaml.v3"
)

// MaxFileBytes bounds a scenario file.
const MaxFileBytes = 4 << 20

var (
	regionRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,62}$`)
	keyRE    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)
)

// Load reads and parses the scenario file at path.
func Load(path string) (*Scenario, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: while reading %s: %v", ErrInvalid, path, err)
	}
	if len(data) > MaxFileBytes {
		return nil, &Error{File: path, Msg: fmt.Sprintf("larger than %d bytes", MaxFileBytes)}
	}
	return Parse(data, path)
}

// Parse parses and validates one scenario; file names it in error messages ("" for none).
// It returns the first problem found, as an *Error naming the line and the field.
func Parse(data []byte, file string) (sc *Scenario, err error) {
	p := &parser{file: file}
	doc, err := p.decode(data)
	if err != nil {
		return nil, err
	}
	defer func() {
		if r := recover(); r != nil {
			if e, ok := r.(*Error); ok {
				sc, err = nil, e
				return
			}
			panic(r)
		}
	}()
	root := doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	return p.scenario(root), nil
}

// decode reads exactly one YAML document. A panic inside the YAML library (it has had
// some on hostile input) is turned into an error rather than taking the caller down.
func (p *parser) decode(data []byte) (doc *yaml.Node, err error) {
	defer func() {
		if r := recover(); r != nil {
			doc, err = nil, p.errf(nil, "", "unreadable YAML: %v", r)
		}
	}()
	doc = new(yaml.Node)
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(doc); err != nil {
		if err == io.EOF {
			return nil, p.errf(nil, "", "empty file")
		}
		return nil, &Error{File: p.file, Msg: err.Error()}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err != io.EOF {
		return nil, p.errf(&extra, "", "more than one YAML document")
	}
	return doc, nil
}

// parser walks the YAML node tree. Errors are raised as *Error panics and recovered by
// Parse, so each field's check reads as one line.
type parser struct {
	file string
}

func (p *parser) errf(n *yaml.Node, field, format string, a ...any) *Error {
	e := &Error{File: p.file, Field: field, Msg: fmt.Sprintf(format, a...)}
	if n != nil {
		e.Line = n.Line
	}
	return e
}

func (p *parser) fail(n *yaml.Node, field, format string, a ...any) {
	panic(p.errf(n, field, format, a...))
}

// fields checks that n is a mapping with only the allowed keys (each at most once) and
// returns the values by key.
func (p *parser) fields(n *yaml.Node, field string, allowed ...string) map[string]*yaml.Node {
	n = p.deref(n)
	if n.Kind != yaml.MappingNode {
		p.fail(n, field, "want a mapping, got %s", kindName(n))
	}
	out := make(map[string]*yaml.Node, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name := k.Value
		if k.Kind != yaml.ScalarNode {
			p.fail(k, field, "keys must be plain words")
		}
		ok := false
		for _, a := range allowed {
			if a == name {
				ok = true
				break
			}
		}
		if !ok {
			p.fail(k, join(field, name), "unknown field (want one of %v)", allowed)
		}
		if _, dup := out[name]; dup {
			p.fail(k, join(field, name), "appears twice")
		}
		out[name] = v
	}
	return out
}

func (p *parser) deref(n *yaml.Node) *yaml.Node {
	for depth := 0; n.Kind == yaml.AliasNode; depth++ {
		if depth > 8 || n.Alias == nil {
			p.fail(n, "", "alias too deep")
		}
		n = n.Alias
	}
	return n
}

func join(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "." + name
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "nothing"
		}
		return fmt.Sprintf("%q", n.Value)
	case yaml.AliasNode:
		return "an alias"
	}
	return "nothing"
}

func (p *parser) scalar(n *yaml.Node, field string) string {
	n = p.deref(n)
	if n.Kind != yaml.ScalarNode {
		p.fail(n, field, "want a value, got %s", kindName(n))
	}
	return n.Value
}

func (p *parser) str(n *yaml.Node, field string) string {
	n = p.deref(n)
	v := p.scalar(n, field)
	if n.Tag != "!!str" {
		p.fail(n, field, "%q: want a string", v)
	}
	return v
}

func (p *parser) num(n *yaml.Node, field string) float64 {
	n = p.deref(n)
	v := p.scalar(n, field)
	if n.Tag != "!!int" && n.Tag != "!!float" {
		p.fail(n, field, "%q: want a number", v)
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		i, ierr := strconv.ParseInt(v, 0, 64)
		if ierr != nil {
			p.fail(n, field, "%q: want a number", v)
		}
		f = float64(i)
	}
	if !finite(f) {
		p.fail(n, field, "%s: must be finite", v)
	}
	return f
}

func (p *parser) integer(n *yaml.Node, field string) int64 {
	n = p.deref(n)
	v := p.scalar(n, field)
	if n.Tag != "!!int" {
		p.fail(n, field, "%q: want a whole number", v)
	}
	i, err := strconv.ParseInt(v, 0, 64)
	if err != nil {
		p.fail(n, field, "%q: want a whole number", v)
	}
	return i
}

// duration reads a Go duration ("180s", "1m", "500ms"); a bare 0 is accepted as 0s.
func (p *parser) duration(n *yaml.Node, field string) time.Duration {
	n = p.deref(n)
	v := p.scalar(n, field)
	if v == "0" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil || n.Tag != "!!str" {
		p.fail(n, field, "%q: want a duration like 500ms, 10s, 1m", v)
	}
	if d < 0 {
		p.fail(n, field, "%s: must not be negative", v)
	}
	return d
}

func (p *parser) scenario(root *yaml.Node) *Scenario {
	f := p.fields(root, "", "name", "duration", "seed", "interval", "propagation",
		"regions", "keys", "faults", "expect")
	sc := &Scenario{
		Seed:        DefaultSeed,
		Interval:    DefaultInterval,
		Propagation: DefaultPropagation,
		Expect:      Expect{DefaultMaxWindowRatio, DefaultSteadyRatio, DefaultRecoveryS},
	}
	need := func(name string) *yaml.Node {
		n, ok := f[name]
		if !ok {
			p.fail(root, name, "missing")
		}
		return n
	}
	n := need("name")
	sc.Name = p.str(n, "name")
	if !keyRE.MatchString(sc.Name) {
		p.fail(n, "name", "%q: want a word like shift-eu-to-us", sc.Name)
	}
	n = need("duration")
	sc.Duration = p.duration(n, "duration")
	if sc.Duration < time.Second || sc.Duration > MaxDuration || sc.Duration%time.Second != 0 {
		p.fail(n, "duration", "%v: must be whole seconds in [1s, %v]", sc.Duration, MaxDuration)
	}
	if n, ok := f["seed"]; ok {
		sc.Seed = p.integer(n, "seed")
	}
	if n, ok := f["interval"]; ok {
		sc.Interval = p.duration(n, "interval")
		if sc.Interval < 100*time.Millisecond || sc.Interval > 10*time.Minute {
			p.fail(n, "interval", "%v: must be in [100ms, 10m]", sc.Interval)
		}
	}
	if n, ok := f["propagation"]; ok {
		sc.Propagation = p.duration(n, "propagation")
		if sc.Propagation > time.Minute {
			p.fail(n, "propagation", "%v: must be in [0, 1m]", sc.Propagation)
		}
	}
	p.regions(need("regions"), sc)
	p.keys(need("keys"), sc)
	if n, ok := f["faults"]; ok {
		p.faults(n, sc)
	}
	if n, ok := f["expect"]; ok {
		p.expect(n, sc)
	}
	return sc
}

func (p *parser) regions(n *yaml.Node, sc *Scenario) {
	n = p.deref(n)
	if n.Kind != yaml.MappingNode || len(n.Content) == 0 {
		p.fail(n, "regions", "want a mapping of region names to {enforcers: N}, got %s", kindName(n))
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		name := k.Value
		field := "regions." + name
		if k.Kind != yaml.ScalarNode || !regionRE.MatchString(name) {
			p.fail(k, "regions", "%q: want a region name like us-east", name)
		}
		if sc.RegionIndex(name) >= 0 {
			p.fail(k, field, "appears twice")
		}
		if len(sc.Regions) == MaxRegions {
			p.fail(k, field, "more than %d regions", MaxRegions)
		}
		rf := p.fields(v, field, "enforcers")
		en, ok := rf["enforcers"]
		if !ok {
			p.fail(v, field+".enforcers", "missing")
		}
		e := p.integer(en, field+".enforcers")
		if e < 1 || e > MaxEnforcers {
			p.fail(en, field+".enforcers", "%d: must be in [1, %d]", e, MaxEnforcers)
		}
		sc.Regions = append(sc.Regions, Region{Name: name, Enforcers: int(e)})
	}
}

func (p *parser) seq(n *yaml.Node, field string) []*yaml.Node {
	n = p.deref(n)
	if n.Kind != yaml.SequenceNode {
		p.fail(n, field, "want a list, got %s", kindName(n))
	}
	return n.Content
}

func (p *parser) keys(n *yaml.Node, sc *Scenario) {
	items := p.seq(n, "keys")
	if len(items) == 0 || len(items) > MaxKeys {
		p.fail(n, "keys", "%d keys: want 1 to %d", len(items), MaxKeys)
	}
	seen := map[string]bool{}
	for i, it := range items {
		field := fmt.Sprintf("keys[%d]", i)
		f := p.fields(it, field, "name", "limit", "phases")
		var k Key
		nn, ok := f["name"]
		if !ok {
			p.fail(it, field+".name", "missing")
		}
		k.Name = p.str(nn, field+".name")
		if !keyRE.MatchString(k.Name) {
			p.fail(nn, field+".name", "%q: want a word of letters, digits, '.', '_' or '-' (at most 64)", k.Name)
		}
		if seen[k.Name] {
			p.fail(nn, field+".name", "%q appears twice", k.Name)
		}
		seen[k.Name] = true
		field = fmt.Sprintf("keys[%d] %q", i, k.Name)
		ln, ok := f["limit"]
		if !ok {
			p.fail(it, field+".limit", "missing")
		}
		k.Limit = p.limit(ln, field+".limit")
		pn, ok := f["phases"]
		if !ok {
			p.fail(it, field+".phases", "missing")
		}
		k.Phases = p.phases(pn, field+".phases", sc)
		sc.Keys = append(sc.Keys, k)
	}
}

func (p *parser) limit(n *yaml.Node, field string) Limit {
	f := p.fields(n, field, "rate", "per", "burst")
	l := Limit{Per: time.Second}
	rn, ok := f["rate"]
	if !ok {
		p.fail(n, field+".rate", "missing")
	}
	l.Rate = p.num(rn, field+".rate")
	if l.Rate <= 0 {
		p.fail(rn, field+".rate", "%g: must be > 0", l.Rate)
	}
	if pn, ok := f["per"]; ok {
		l.Per = p.duration(pn, field+".per")
		if l.Per < time.Millisecond || l.Per > 24*time.Hour {
			p.fail(pn, field+".per", "%v: must be in [1ms, 24h]", l.Per)
		}
	}
	if l.PerSecond() > MaxRate {
		p.fail(rn, field+".rate", "%g per %v is more than %g a second", l.Rate, l.Per, float64(MaxRate))
	}
	l.Burst = l.Rate
	if bn, ok := f["burst"]; ok {
		l.Burst = p.num(bn, field+".burst")
		if l.Burst < 1 || l.Burst > 1e12 {
			p.fail(bn, field+".burst", "%g: must be in [1, 1e12]", l.Burst)
		}
	}
	if l.Burst < 1 {
		p.fail(rn, field+".burst", "defaults to the rate %g, which is below 1: give a burst", l.Rate)
	}
	return l
}

func (p *parser) phases(n *yaml.Node, field string, sc *Scenario) []Phase {
	items := p.seq(n, field)
	if len(items) == 0 {
		p.fail(n, field, "want at least one phase")
	}
	var out []Phase
	for i, it := range items {
		pf := fmt.Sprintf("%s[%d]", field, i)
		f := p.fields(it, pf, "at", "offered")
		an, ok := f["at"]
		if !ok {
			p.fail(it, pf+".at", "missing")
		}
		ph := Phase{At: p.duration(an, pf+".at"), Offered: make([]float64, len(sc.Regions))}
		if ph.At >= sc.Duration {
			p.fail(an, pf+".at", "%v: must be before the end (%v)", ph.At, sc.Duration)
		}
		if len(out) > 0 && ph.At <= out[len(out)-1].At {
			p.fail(an, pf+".at", "%v: phases must be in increasing order of at (the one before is at %v)", ph.At, out[len(out)-1].At)
		}
		on, ok := f["offered"]
		if !ok {
			p.fail(it, pf+".offered", "missing")
		}
		on = p.deref(on)
		if on.Kind != yaml.MappingNode {
			p.fail(on, pf+".offered", "want a mapping of region to requests/s, got %s", kindName(on))
		}
		seen := map[string]bool{}
		for j := 0; j+1 < len(on.Content); j += 2 {
			k, v := on.Content[j], on.Content[j+1]
			r := sc.RegionIndex(k.Value)
			of := pf + ".offered." + k.Value
			if r < 0 {
				p.fail(k, of, "unknown region (declare it under regions)")
			}
			if seen[k.Value] {
				p.fail(k, of, "appears twice")
			}
			seen[k.Value] = true
			x := p.num(v, of)
			if x < 0 || x > MaxRate {
				p.fail(v, of, "%g: must be in [0, %g]", x, float64(MaxRate))
			}
			ph.Offered[r] = x
		}
		out = append(out, ph)
	}
	return out
}

func (p *parser) faults(n *yaml.Node, sc *Scenario) {
	for i, it := range p.seq(n, "faults") {
		field := fmt.Sprintf("faults[%d]", i)
		f := p.fields(it, field, "at", "for", "kind", "region", "enforcer")
		need := func(name string) *yaml.Node {
			v, ok := f[name]
			if !ok {
				p.fail(it, field+"."+name, "missing")
			}
			return v
		}
		var ft Fault
		an := need("at")
		ft.At = p.duration(an, field+".at")
		if ft.At >= sc.Duration {
			p.fail(an, field+".at", "%v: must be before the end (%v)", ft.At, sc.Duration)
		}
		fn := need("for")
		ft.For = p.duration(fn, field+".for")
		if ft.For <= 0 {
			p.fail(fn, field+".for", "%v: must be > 0", ft.For)
		}
		kn := need("kind")
		ft.Kind = p.str(kn, field+".kind")
		switch ft.Kind {
		case RedisDown, RegionIsolated, EnforcerIsolated, RegionRestart:
			rn := need("region")
			name := p.str(rn, field+".region")
			if ft.Region = sc.RegionIndex(name); ft.Region < 0 {
				p.fail(rn, field+".region", "%q: unknown region (declare it under regions)", name)
			}
		case BalancerDown, LeaderChange:
			if rn, ok := f["region"]; ok {
				p.fail(rn, field+".region", "%s takes no region", ft.Kind)
			}
			ft.Region = -1
		default:
			p.fail(kn, field+".kind", "%q: want %s, %s, %s, %s, %s or %s", ft.Kind,
				RedisDown, BalancerDown, RegionIsolated, EnforcerIsolated, LeaderChange, RegionRestart)
		}
		if en, ok := f["enforcer"]; ok {
			if ft.Kind != EnforcerIsolated {
				p.fail(en, field+".enforcer", "only %s takes an enforcer", EnforcerIsolated)
			}
			x := p.num(en, field+".enforcer")
			if n := sc.Regions[ft.Region].Enforcers; x != math.Trunc(x) || x < 0 || x >= float64(n) {
				p.fail(en, field+".enforcer", "%g: want an index in [0, %d) (%s has %d enforcers)", x, n, sc.Regions[ft.Region].Name, n)
			}
			ft.Enforcer = int(x)
		}
		sc.Faults = append(sc.Faults, ft)
	}
	sort.SliceStable(sc.Faults, func(i, j int) bool { return sc.Faults[i].At < sc.Faults[j].At })
}

func (p *parser) expect(n *yaml.Node, sc *Scenario) {
	f := p.fields(n, "expect", "max_window_ratio", "steady_ratio", "recovery_s")
	if v, ok := f["max_window_ratio"]; ok {
		sc.Expect.MaxWindowRatio = p.num(v, "expect.max_window_ratio")
		if sc.Expect.MaxWindowRatio <= 0 || sc.Expect.MaxWindowRatio > 1000 {
			p.fail(v, "expect.max_window_ratio", "%g: must be in (0, 1000]", sc.Expect.MaxWindowRatio)
		}
	}
	if v, ok := f["steady_ratio"]; ok {
		sc.Expect.SteadyRatio = p.num(v, "expect.steady_ratio")
		if sc.Expect.SteadyRatio < 0 || sc.Expect.SteadyRatio > 1 {
			p.fail(v, "expect.steady_ratio", "%g: must be in [0, 1]", sc.Expect.SteadyRatio)
		}
	}
	if v, ok := f["recovery_s"]; ok {
		sc.Expect.RecoveryS = p.num(v, "expect.recovery_s")
		if sc.Expect.RecoveryS < 0 {
			p.fail(v, "expect.recovery_s", "%g: must be >= 0", sc.Expect.RecoveryS)
		}
	}
}
