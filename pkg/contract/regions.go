package contract

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Regions are the regions that enforce the global limits, with their weights: the default
// split gives region r weight_r / Σ weights of a rule that lists no shares: (see
// rules.DefaultShare). The enforcers read it as regions: and the balancer as weights:
// (over its ordered regions:); both parse it here, so they agree on the syntax. Written as a mapping (`{us-east: 2, eu-west: 1}`; an empty weight
// means 1) or as a list (`[us-east, eu-west]`: equal weights). Empty: a single-region
// deployment, every rule's share is 1 unless its shares: names this region.
type Regions map[string]float64

// UnmarshalYAML reads the list or the mapping form.
func (r *Regions) UnmarshalYAML(n *yaml.Node) error {
	out := Regions{}
	switch n.Kind {
	case yaml.SequenceNode:
		var names []string
		if err := n.Decode(&names); err != nil {
			return err
		}
		for _, name := range names {
			out[name] = 1
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if v.Tag == "!!null" {
				out[k.Value] = 1
				continue
			}
			var w float64
			if err := v.Decode(&w); err != nil {
				return fmt.Errorf("regions: %s: %w", k.Value, err)
			}
			out[k.Value] = w
		}
	default:
		return fmt.Errorf("line %d: regions: want a list of names or a mapping of name: weight", n.Line)
	}
	*r = out
	return nil
}

// ParseRegions reads the flag and environment form: "us-east,eu-west" or
// "us-east=2,eu-west=1" (a name without "=" has weight 1).
func ParseRegions(v string) (Regions, error) {
	out := Regions{}
	for _, part := range strings.Split(v, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		name, w, hasW := strings.Cut(part, "=")
		weight := 1.0
		if hasW {
			var err error
			if weight, err = strconv.ParseFloat(strings.TrimSpace(w), 64); err != nil {
				return nil, fmt.Errorf("region %q: weight %q: %w", name, w, err)
			}
		}
		out[strings.TrimSpace(name)] = weight
	}
	return out, nil
}

func (r Regions) String() string {
	names := make([]string, 0, len(r))
	for n := range r {
		names = append(names, n)
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s=%g", n, r[n])
	}
	return strings.Join(parts, ",")
}
