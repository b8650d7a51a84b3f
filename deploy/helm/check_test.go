package helm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/certs"
	"gopkg.in/yaml.v3"
)

// The Kubernetes objects the tests read, as much of them as they need.
type (
	object struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Metadata   struct {
			Name   string            `yaml:"name"`
			Labels map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Data map[string]string `yaml:"data"` // ConfigMap
		Spec struct {
			Template struct {
				Spec podSpec `yaml:"spec"`
			} `yaml:"template"` // Deployment
		} `yaml:"spec"`
	}
	podSpec struct {
		Containers     []container `yaml:"containers"`
		InitContainers []container `yaml:"initContainers"`
		Volumes        []volume    `yaml:"volumes"`
	}
	container struct {
		Name         string   `yaml:"name"`
		Image        string   `yaml:"image"`
		Command      []string `yaml:"command"`
		Args         []string `yaml:"args"`
		Env          []envVar `yaml:"env"`
		VolumeMounts []struct {
			Name      string `yaml:"name"`
			MountPath string `yaml:"mountPath"`
			SubPath   string `yaml:"subPath"`
		} `yaml:"volumeMounts"`
		Ports []struct {
			Name          string `yaml:"name"`
			ContainerPort int    `yaml:"containerPort"`
		} `yaml:"ports"`
		Resources struct {
			Limits map[string]string `yaml:"limits"`
		} `yaml:"resources"`
		StartupProbe   *probe `yaml:"startupProbe"`
		LivenessProbe  *probe `yaml:"livenessProbe"`
		ReadinessProbe *probe `yaml:"readinessProbe"`
	}
	probe struct {
		HTTPGet *struct {
			Path string `yaml:"path"`
			Port string `yaml:"port"`
		} `yaml:"httpGet"`
	}
	envVar struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			FieldRef *struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
			ResourceFieldRef *struct {
				Resource string `yaml:"resource"`
			} `yaml:"resourceFieldRef"`
			SecretKeyRef    *keyRef `yaml:"secretKeyRef"`
			ConfigMapKeyRef *keyRef `yaml:"configMapKeyRef"`
		} `yaml:"valueFrom"`
	}
	keyRef struct {
		Name     string `yaml:"name"`
		Key      string `yaml:"key"`
		Optional bool   `yaml:"optional"`
	}
	volume struct {
		Name      string `yaml:"name"`
		ConfigMap *struct {
			Name  string    `yaml:"name"`
			Items []keyPath `yaml:"items"`
		} `yaml:"configMap"`
		Secret *struct {
			SecretName string    `yaml:"secretName"`
			Items      []keyPath `yaml:"items"`
		} `yaml:"secret"`
	}
	keyPath struct {
		Key  string `yaml:"key"`
		Path string `yaml:"path"`
	}
)

// parseManifests reads helm template's output, one object per document.
func parseManifests(t *testing.T, out []byte) []object {
	t.Helper()
	var objs []object
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		var o object
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("rendered manifests: %v", err)
		}
		if o.Kind != "" {
			objs = append(objs, o)
		}
	}
}

// The pod names and address a rendered pod is given in the test (nothing dials it).
const (
	testPodName = "allot-pod-0"
	testPodIP   = "127.0.0.2"
)

// cluster is what a rendered pod finds outside the chart: the Secrets its values name,
// made as the chart's values say (the report certificates by `balancer certs`).
type cluster struct {
	secrets map[string]map[string]string
}

var certsOnce struct {
	sync.Once
	dir string
	err error
}

// newCluster makes the Secrets of the values files' comments once per test binary.
func newCluster(t *testing.T) cluster {
	t.Helper()
	certsOnce.Do(func() {
		certsOnce.dir, certsOnce.err = os.MkdirTemp("", "allot-helm-certs-")
		if certsOnce.err == nil {
			_, certsOnce.err = certs.Generate(certsOnce.dir, certs.Options{Regions: regions, Hosts: []string{"allot-balancer"}, Now: time.Now()})
		}
	})
	if certsOnce.err != nil {
		t.Fatal(certsOnce.err)
	}
	f := certs.Files{Dir: certsOnce.dir}
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	// One region's enforcer certificate per release: the test renders each region with its own.
	c := cluster{secrets: map[string]map[string]string{
		"allot-balancer-tls":     {"ca.pem": read(f.CA()), "cert.pem": read(f.Balancer()), "key.pem": read(f.BalancerKey())},
		"allot-redis":            {"password": "redis-secret"},
		"allot-etcd":             {"password": "etcd-secret"},
		"allot-identity-digest":  {"key": "0123456789abcdef0123456789abcdef"},
		"allot-dashboard-tokens": {"tokens": "viewer:0123456789abcdef0123"},
		"allot-admin-tokens":     {"tokens": "ops:fedcba9876543210fedcba98"},
	}}
	for _, r := range regions {
		c.secrets["allot-report-tls/"+r] = map[string]string{"ca.pem": read(f.CA()), "cert.pem": read(f.Enforcer(r)), "key.pem": read(f.EnforcerKey(r))}
	}
	return c
}

// secret is the Secret name as the release of region sees it.
func (c cluster) secret(region, name string) (map[string]string, bool) {
	if s, ok := c.secrets[name+"/"+region]; ok {
		return s, true
	}
	s, ok := c.secrets[name]
	return s, ok
}

var binsOnce struct {
	sync.Once
	dir string
	err error
	out []byte
}

// binaries builds the enforcer and balancer once per test binary, the binaries the image
// holds under /usr/local/bin.
func binaries(t *testing.T) string {
	t.Helper()
	binsOnce.Do(func() {
		if binsOnce.dir, binsOnce.err = os.MkdirTemp("", "allot-helm-bin-"); binsOnce.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", binsOnce.dir+"/", "./cmd/enforcer", "./cmd/balancer")
		cmd.Dir = "../.."
		binsOnce.out, binsOnce.err = cmd.CombinedOutput()
	})
	if binsOnce.err != nil {
		t.Fatalf("go build ./cmd/enforcer ./cmd/balancer: %v\n%s", binsOnce.err, binsOnce.out)
	}
	return binsOnce.dir
}

// Every container the chart renders, for every region, passes its binary's own
// -check-config with the command line, environment and files its pod would have.
func TestRenderedContainersPassTheirChecks(t *testing.T) {
	helm(t) // skips before the build when helm is not there (-short)
	bins := binaries(t)
	cl := newCluster(t)
	for _, c := range renderCases {
		t.Run(c.name, func(t *testing.T) {
			objs := parseManifests(t, render(t, c))
			configMaps := map[string]map[string]string{}
			for _, o := range objs {
				if o.Kind == "ConfigMap" {
					configMaps[o.Metadata.Name] = o.Data
				}
			}
			var checked []string
			for _, o := range objs {
				if o.Kind != "Deployment" {
					continue
				}
				ps := o.Spec.Template.Spec
				if len(ps.InitContainers) > 0 {
					t.Errorf("%s: init containers are not checked here; check them too", o.Metadata.Name)
				}
				for _, ctr := range ps.Containers {
					checkContainer(t, c.region, o.Metadata.Name, ctr, ps.Volumes, configMaps, cl, bins)
					checked = append(checked, o.Metadata.Name+"/"+ctr.Name)
				}
			}
			wantN := 1 // the enforcers
			if c.region == "us-east" {
				wantN++ // and the balancer
			}
			if len(checked) != wantN {
				t.Errorf("checked %v, want %d containers", checked, wantN)
			}
		})
	}
}

// checkContainer lays out ctr's pod files under a temporary root, resolves its environment
// as the kubelet would, and runs its binary with its arguments and -check-config.
func checkContainer(t *testing.T, region, deploy string, ctr container, vols []volume,
	configMaps map[string]map[string]string, cl cluster, bins string) {
	t.Helper()
	where := deploy + "/" + ctr.Name
	if len(ctr.Command) != 1 {
		t.Errorf("%s: command %q, want the binary alone (flags in args)", where, ctr.Command)
		return
	}
	bin := path.Base(ctr.Command[0])
	if ctr.Command[0] != "/usr/local/bin/"+bin || (bin != "enforcer" && bin != "balancer") {
		t.Errorf("%s: command %q is not an allot binary in the image (/usr/local/bin/enforcer or balancer)", where, ctr.Command[0])
		return
	}
	checkProbes(t, where, ctr)

	// The pod's files: each mount's ConfigMap or Secret keys, under root.
	root := t.TempDir()
	byName := map[string]volume{}
	for _, v := range vols {
		byName[v.Name] = v
	}
	var mounts []string
	for _, m := range ctr.VolumeMounts {
		v, ok := byName[m.Name]
		if !ok {
			t.Errorf("%s: mount %q has no volume", where, m.Name)
			continue
		}
		var data map[string]string
		var items []keyPath
		switch {
		case v.ConfigMap != nil:
			if data, ok = configMaps[v.ConfigMap.Name]; !ok {
				t.Errorf("%s: ConfigMap %q is not rendered by the chart", where, v.ConfigMap.Name)
				continue
			}
			items = v.ConfigMap.Items
		case v.Secret != nil:
			if data, ok = cl.secret(region, v.Secret.SecretName); !ok {
				t.Errorf("%s: Secret %q is none the values files tell a user to make", where, v.Secret.SecretName)
				continue
			}
			items = v.Secret.Items
		default:
			t.Errorf("%s: volume %q is neither a ConfigMap nor a Secret; teach the test its files", where, v.Name)
			continue
		}
		files := map[string]string{} // path in the volume → content
		if items == nil {
			for k, val := range data {
				files[k] = val
			}
		}
		for _, it := range items {
			val, ok := data[it.Key]
			if !ok {
				t.Errorf("%s: volume %q: key %q is not in %v", where, v.Name, it.Key, slices.Sorted(maps.Keys(data)))
			}
			files[it.Path] = val
		}
		if m.SubPath != "" {
			val, ok := files[m.SubPath]
			if !ok {
				t.Errorf("%s: mount %q: subPath %q is not in the volume", where, m.Name, m.SubPath)
			}
			files = map[string]string{"": val}
		}
		for p, val := range files {
			dst := filepath.Join(root, m.MountPath, p)
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst, []byte(val), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		mounts = append(mounts, m.MountPath)
	}
	// A path under a mount, in an argument, a variable or a mounted file, is the same
	// path under root: one pass, longest mount first.
	relocate := func(s string) string { return s }
	if len(mounts) > 0 {
		sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
		alt := make([]string, len(mounts))
		for i, m := range mounts {
			alt[i] = regexp.QuoteMeta(m)
		}
		re := regexp.MustCompile(`(?:` + strings.Join(alt, "|") + `)(?:/|$|[^\w.-])`)
		relocate = func(s string) string { return re.ReplaceAllStringFunc(s, func(m string) string { return root + m }) }
	}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(p, []byte(relocate(string(b))), 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}

	// The environment, resolved in order as the kubelet does ($(VAR) of earlier ones).
	env := map[string]string{}
	var environ []string
	for _, e := range ctr.Env {
		val, ok := resolveEnv(t, where, region, e, ctr, configMaps, cl, env)
		if !ok {
			continue
		}
		env[e.Name] = relocate(val)
		environ = append(environ, e.Name+"="+env[e.Name])
	}
	args := make([]string, 0, len(ctr.Args)+1)
	for _, a := range ctr.Args {
		args = append(args, relocate(expand(a, env)))
	}
	args = append(args, "-check-config")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bins, bin), args...)
	cmd.Env = environ // the container's, nothing of the test's
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		// The error, not the usage a flag error prints after it.
		if i := bytes.Index(out, []byte("\nusage: ")); i >= 0 {
			out = out[:i]
		}
		t.Errorf("%s: %s %s: %v\n%s\nenvironment: %q", where, bin, strings.Join(args, " "), err, out, environ)
		return
	}
	t.Logf("%s: %s", where, bytes.TrimSpace(out))
}

// resolveEnv is one variable's value as the kubelet gives it; false when it is left out
// (an optional Secret that does not exist).
func resolveEnv(t *testing.T, where, region string, e envVar, ctr container,
	configMaps map[string]map[string]string, cl cluster, env map[string]string) (string, bool) {
	t.Helper()
	vf := e.ValueFrom
	switch {
	case vf == nil:
		return expand(e.Value, env), true
	case vf.FieldRef != nil:
		switch vf.FieldRef.FieldPath {
		case "metadata.name":
			return testPodName, true
		case "status.podIP":
			return testPodIP, true
		}
		t.Errorf("%s: %s: fieldRef %q: teach the test its value", where, e.Name, vf.FieldRef.FieldPath)
	case vf.ResourceFieldRef != nil:
		res, ok := strings.CutPrefix(vf.ResourceFieldRef.Resource, "limits.")
		q, set := ctr.Resources.Limits[res]
		if !ok || !set {
			t.Errorf("%s: %s: resourceFieldRef %q: no such limit", where, e.Name, vf.ResourceFieldRef.Resource)
			return "", false
		}
		n, err := quantity(q)
		if err != nil {
			t.Errorf("%s: %s: %v", where, e.Name, err)
		}
		return strconv.FormatInt(n, 10), true
	case vf.SecretKeyRef != nil:
		r := vf.SecretKeyRef
		s, ok := cl.secret(region, r.Name)
		if !ok {
			if !r.Optional {
				t.Errorf("%s: %s: Secret %q is none the values files tell a user to make, and is not optional", where, e.Name, r.Name)
			}
			return "", false
		}
		v, ok := s[r.Key]
		if !ok {
			t.Errorf("%s: %s: Secret %q has no key %q", where, e.Name, r.Name, r.Key)
		}
		return v, ok
	case vf.ConfigMapKeyRef != nil:
		v, ok := configMaps[vf.ConfigMapKeyRef.Name][vf.ConfigMapKeyRef.Key]
		if !ok && !vf.ConfigMapKeyRef.Optional {
			t.Errorf("%s: %s: ConfigMap key %s/%s is not rendered", where, e.Name, vf.ConfigMapKeyRef.Name, vf.ConfigMapKeyRef.Key)
		}
		return v, ok
	default:
		t.Errorf("%s: %s: a valueFrom the test does not know", where, e.Name)
	}
	return "", false
}

var varRef = regexp.MustCompile(`\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)`)

// expand replaces $(VAR) with an earlier variable's value, as Kubernetes does in args and
// env values ($$ is a $; an unknown $(VAR) stays as written).
func expand(s string, env map[string]string) string {
	return varRef.ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		if v, ok := env[m[2:len(m)-1]]; ok {
			return v
		}
		return m
	})
}

// quantity reads a Kubernetes memory quantity in bytes (an integer, or Ki/Mi/Gi/Ti).
func quantity(q string) (int64, error) {
	mult := int64(1)
	for i, suf := range []string{"Ki", "Mi", "Gi", "Ti"} {
		if n, ok := strings.CutSuffix(q, suf); ok {
			q, mult = n, int64(1)<<(10*(i+1))
			break
		}
	}
	n, err := strconv.ParseInt(q, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("quantity %q: want an integer, or one with Ki, Mi, Gi or Ti", q)
	}
	return n * mult, nil
}

// checkProbes: each process has its three probes, on a port it declares, at a path both
// binaries serve on their HTTP listener.
func checkProbes(t *testing.T, where string, ctr container) {
	t.Helper()
	ports := map[string]bool{}
	for _, p := range ctr.Ports {
		ports[p.Name] = true
	}
	for name, p := range map[string]*probe{"startupProbe": ctr.StartupProbe, "livenessProbe": ctr.LivenessProbe, "readinessProbe": ctr.ReadinessProbe} {
		switch {
		case p == nil || p.HTTPGet == nil:
			t.Errorf("%s: no %s (httpGet)", where, name)
		case !ports[p.HTTPGet.Port]:
			t.Errorf("%s: %s on port %q, which the container does not declare", where, name, p.HTTPGet.Port)
		case p.HTTPGet.Path != "/healthz" && p.HTTPGet.Path != "/readyz":
			t.Errorf("%s: %s on %q; the processes serve /healthz and /readyz", where, name, p.HTTPGet.Path)
		case name == "readinessProbe" && p.HTTPGet.Path != "/readyz":
			t.Errorf("%s: readiness on %q, want /readyz", where, p.HTTPGet.Path)
		}
	}
}
