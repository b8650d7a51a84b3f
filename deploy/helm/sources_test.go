package helm

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	balancerapp "github.com/allot-dev/allot/pkg/balancer/app"
	enforcerapp "github.com/allot-dev/allot/pkg/enforcer/app"
	"gopkg.in/yaml.v3"
)

// The chart carries copies of shipped files (a chart reads only its own directory): each
// equals its source, byte for byte. After changing the source, copy it again.
func TestChartCopiesEqualTheirSources(t *testing.T) {
	for copyOf, src := range map[string]string{
		"allot/files/rules.yaml":       "../../configs/rules/example.yaml",
		"allot/files/allot-rules.yaml": "../../configs/prometheus/allot-rules.yaml",
		"allot/files/allot.json":       "../../configs/grafana/allot.json",
	} {
		a, err := os.ReadFile(copyOf)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s is not a copy of %s: cp %s deploy/helm/%s", copyOf, src, strings.TrimPrefix(src, "../../"), copyOf)
		}
	}
}

// The chart has a values file for each region configs/regions/ has a config for.
func TestChartRegionsAreTheShippedOnes(t *testing.T) {
	cfgs, _ := filepath.Glob("../../configs/regions/*.yaml")
	vals, _ := filepath.Glob("allot/values-*.yaml")
	var a, b []string
	for _, p := range cfgs {
		a = append(a, strings.TrimSuffix(filepath.Base(p), ".yaml"))
	}
	for _, p := range vals {
		b = append(b, strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), "values-"), ".yaml"))
	}
	slices.Sort(a)
	slices.Sort(b)
	want := slices.Sorted(slices.Values(regions))
	if !slices.Equal(a, want) || !slices.Equal(b, want) {
		t.Errorf("configs/regions/ has %v, the chart's values files %v, the test renders %v: keep them one set", a, b, want)
	}
}

// configFile is one file of a rendered ConfigMap, written where a test can parse it.
func configFile(t *testing.T, objs []object, configMap, key string) string {
	t.Helper()
	for _, o := range objs {
		if o.Kind == "ConfigMap" && o.Metadata.Name == configMap {
			v, ok := o.Data[key]
			if !ok {
				break
			}
			p := filepath.Join(t.TempDir(), key)
			if err := os.WriteFile(p, []byte(v), 0o600); err != nil {
				t.Fatal(err)
			}
			return p
		}
	}
	t.Fatalf("no ConfigMap %s with %s rendered", configMap, key)
	return ""
}

func noEnv(string) string { return "" }

// Each region's enforcer config is configs/regions/<region>.yaml translated: the same in
// every field but those Kubernetes decides (listen addresses, the Redis and etcd endpoints,
// the mounted files' paths, the balancer's certificate name, JSON logs).
func TestEnforcerConfigIsTheRegionsConfig(t *testing.T) {
	k8s := func(c *enforcerapp.Config) {
		c.Listen = enforcerapp.ListenConfig{}
		c.Store.Addrs, c.Etcd.Endpoints = nil, nil
		c.Rules.File = ""
		c.Balancer.TLS = enforcerapp.TLSConfig{Enabled: c.Balancer.TLS.Enabled}
		c.LogJSON = false
	}
	for _, r := range regions {
		t.Run(r, func(t *testing.T) {
			objs := parseManifests(t, render(t, renderCase{region: r}))
			got, err := enforcerapp.Parse([]string{"-config", configFile(t, objs, "allot-"+r+"-enforcer", "enforcer.yaml")}, noEnv, io.Discard)
			if err != nil {
				t.Fatalf("rendered enforcer.yaml: %v", err)
			}
			want, err := enforcerapp.Parse([]string{"-config", "../../configs/regions/" + r + ".yaml"}, noEnv, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if got.Listen.GRPC != ":8081" || got.Listen.HTTP != ":8080" || got.Rules.File != "/etc/allot/rules/rules.yaml" || !got.LogJSON {
				t.Errorf("the chart's own fields: listen %+v, rules.file %q, log_json %v", got.Listen, got.Rules.File, got.LogJSON)
			}
			k8s(&got)
			k8s(&want)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("the chart's enforcer config for %s differs from configs/regions/%s.yaml beyond what Kubernetes sets:\n%s",
					r, r, yamlDiff(t, want, got))
			}
		})
	}
}

// The balancer's config is configs/balancer.yaml translated, the same way.
func TestBalancerConfigIsTheShippedOne(t *testing.T) {
	k8s := func(c *balancerapp.Config) {
		c.Listen.GRPC, c.Listen.HTTP = "", ""
		c.Listen.TLS = balancerapp.ServerTLSConfig{Enabled: c.Listen.TLS.Enabled}
		c.Etcd.Endpoints = nil
		c.Rules.File = ""
		c.LogJSON = false
	}
	objs := parseManifests(t, render(t, renderCase{region: "us-east"}))
	got, err := balancerapp.Parse([]string{"-config", configFile(t, objs, "allot-us-east-balancer", "balancer.yaml")}, noEnv, io.Discard)
	if err != nil {
		t.Fatalf("rendered balancer.yaml: %v", err)
	}
	want, err := balancerapp.Parse([]string{"-config", "../../configs/balancer.yaml"}, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got.Listen.GRPC != ":9090" || got.Listen.HTTP != ":9091" || got.Rules.File != "/etc/allot/rules/rules.yaml" {
		t.Errorf("the chart's own fields: listen %+v, rules.file %q", got.Listen, got.Rules.File)
	}
	k8s(&got)
	k8s(&want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the chart's balancer config differs from configs/balancer.yaml beyond what Kubernetes sets:\n%s", yamlDiff(t, want, got))
	}
}

// yamlDiff shows the lines of want and got (as YAML) that differ.
func yamlDiff(t *testing.T, want, got any) string {
	t.Helper()
	w, err := yaml.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	g, err := yaml.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	return firstDiff(string(w), string(g))
}

// The PrometheusRule holds configs/prometheus/allot-rules.yaml's groups as they are, but
// the balancer's where the release runs no balancer; the dashboard ConfigMap holds
// configs/grafana/allot.json.
func TestMonitoringObjectsAreTheShippedOnes(t *testing.T) {
	raw, err := os.ReadFile("../../configs/prometheus/allot-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var src struct {
		Groups []map[string]any `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &src); err != nil {
		t.Fatal(err)
	}
	dashboard, err := os.ReadFile("../../configs/grafana/allot.json")
	if err != nil {
		t.Fatal(err)
	}
	on := []string{"metrics.prometheusRule.enabled=true", "grafanaDashboard.enabled=true"}
	for _, r := range regions {
		t.Run(r, func(t *testing.T) {
			out := render(t, renderCase{region: r, set: on})
			var rule struct {
				Spec struct {
					Groups []map[string]any `yaml:"groups"`
				} `yaml:"spec"`
			}
			var found bool
			dec := yaml.NewDecoder(bytes.NewReader(out))
			for {
				var node yaml.Node
				if err := dec.Decode(&node); err != nil {
					break
				}
				var o object
				if err := node.Decode(&o); err != nil {
					t.Fatal(err)
				}
				switch {
				case o.Kind == "PrometheusRule":
					found = true
					if err := node.Decode(&rule); err != nil {
						t.Fatal(err)
					}
				case o.Kind == "ConfigMap" && o.Data["allot.json"] != "":
					if got := strings.TrimSpace(o.Data["allot.json"]); got != strings.TrimSpace(string(dashboard)) {
						t.Errorf("the dashboard ConfigMap %s is not configs/grafana/allot.json", o.Metadata.Name)
					}
				}
			}
			if !found {
				t.Fatal("no PrometheusRule rendered")
			}
			balancer := r == "us-east" // the region whose values run the balancer
			var want []map[string]any
			for _, g := range src.Groups {
				if balancer || g["name"] != "allot-balancer" {
					want = append(want, g)
				}
			}
			if !reflect.DeepEqual(rule.Spec.Groups, want) {
				t.Errorf("the PrometheusRule's groups are not configs/prometheus/allot-rules.yaml's:\n%s", yamlDiff(t, want, rule.Spec.Groups))
			}
		})
	}
}
