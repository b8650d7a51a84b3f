package xds

// The resources of a response into envoyrl's model, through the YAML loader.

import (
	"fmt"
	"strings"

	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"gopkg.in/yaml.v3"

	"github.com/allot-dev/allot/pkg/envoyrl"
)

// TypeURL is the xDS resource type of envoyproxy/ratelimit's configuration, as Envoy
// Gateway and Kuma serve it.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// MaxResourceBytes bounds one resource (its encoded size); a larger one is refused.
const MaxResourceBytes = 4 << 20

// The YAML shape of a RateLimitConfig: envoyproxy/ratelimit turns a resource into its
// YAML structs and loads those as it loads a file, and so does FromProto, so a resource
// is checked exactly as the same configuration in a file would be.
type (
	yamlRoot struct {
		Domain      string     `yaml:"domain"`
		Descriptors []yamlDesc `yaml:"descriptors,omitempty"`
	}
	yamlDesc struct {
		Key            string     `yaml:"key"`
		Value          string     `yaml:"value,omitempty"`
		RateLimit      *yamlLimit `yaml:"rate_limit,omitempty"`
		Descriptors    []yamlDesc `yaml:"descriptors,omitempty"`
		ShadowMode     bool       `yaml:"shadow_mode,omitempty"`
		DetailedMetric bool       `yaml:"detailed_metric,omitempty"`
	}
	yamlLimit struct {
		Unit            string        `yaml:"unit,omitempty"`
		RequestsPerUnit uint32        `yaml:"requests_per_unit"`
		Unlimited       bool          `yaml:"unlimited,omitempty"`
		Name            string        `yaml:"name,omitempty"`
		Replaces        []yamlReplace `yaml:"replaces,omitempty"`
	}
	yamlReplace struct {
		Name string `yaml:"name"`
	}
)

// FromProto checks one RateLimitConfig resource as envoyproxy/ratelimit would the same
// configuration in a file, and returns its model. Errors and warnings name the resource as
// "xds:NAME" and a line of its YAML form. Fields of a newer revision of the resource type
// than allot knows (quota_mode, metadata) are not ignored silently: they are named in the
// warnings.
func FromProto(pb *rlconf.RateLimitConfig) (*envoyrl.Config, error) {
	name := "xds:" + pb.GetName()
	if pb.GetName() == "" {
		return nil, &envoyrl.Error{File: "xds:", Msg: "a RateLimitConfig resource without a name"}
	}
	var unknown []string
	root := yamlRoot{Domain: pb.GetDomain(), Descriptors: descriptors(pb.GetDescriptors(), "descriptors", &unknown)}
	if len(pb.ProtoReflect().GetUnknown()) > 0 {
		unknown = append(unknown, "the resource")
	}
	data, err := yaml.Marshal(&root)
	if err != nil {
		return nil, &envoyrl.Error{File: name, Msg: err.Error()}
	}
	cfg, err := envoyrl.Parse(name, data)
	if err != nil {
		return nil, err
	}
	for _, where := range unknown {
		cfg.Warnings = append(cfg.Warnings, fmt.Sprintf("%s: %s has fields this allot does not know (a newer RateLimitConfig revision: quota_mode, metadata?); they are ignored", name, where))
	}
	return cfg, nil
}

func descriptors(pb []*rlconf.RateLimitDescriptor, at string, unknown *[]string) []yamlDesc {
	if len(pb) == 0 {
		return nil
	}
	out := make([]yamlDesc, len(pb))
	for i, d := range pb {
		here := fmt.Sprintf("%s[%d]", at, i)
		if hasUnknown(d) {
			*unknown = append(*unknown, here)
		}
		out[i] = yamlDesc{Key: d.GetKey(), Value: d.GetValue(), ShadowMode: d.GetShadowMode(), DetailedMetric: d.GetDetailedMetric(),
			Descriptors: descriptors(d.GetDescriptors(), here+".descriptors", unknown)}
		if p := d.GetRateLimit(); p != nil {
			if hasUnknown(p) {
				*unknown = append(*unknown, here+".rate_limit")
			}
			l := &yamlLimit{RequestsPerUnit: p.GetRequestsPerUnit(), Unlimited: p.GetUnlimited(), Name: p.GetName()}
			if p.GetUnit() != rlconf.RateLimitUnit_UNKNOWN {
				l.Unit = strings.ToLower(p.GetUnit().String())
			}
			for _, r := range p.GetReplaces() {
				l.Replaces = append(l.Replaces, yamlReplace{Name: r.GetName()})
			}
			out[i].RateLimit = l
		}
	}
	return out
}

func hasUnknown(m proto.Message) bool { return len(m.ProtoReflect().GetUnknown()) > 0 }

// decode unpacks one resource of a response.
func decode(a *anypb.Any) (*rlconf.RateLimitConfig, error) {
	if a.GetTypeUrl() != TypeURL {
		return nil, fmt.Errorf("a resource of type %.128q, want %s", a.GetTypeUrl(), TypeURL)
	}
	if len(a.GetValue()) > MaxResourceBytes {
		return nil, fmt.Errorf("a resource of %d bytes, more than %d", len(a.GetValue()), MaxResourceBytes)
	}
	pb := &rlconf.RateLimitConfig{}
	if err := proto.Unmarshal(a.GetValue(), pb); err != nil {
		return nil, fmt.Errorf("a resource that does not decode as a RateLimitConfig: %w", err)
	}
	return pb, nil
}
