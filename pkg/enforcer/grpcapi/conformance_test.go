package grpcapi

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/enforcer/enforcertest"
	"github.com/allot-dev/allot/pkg/envoyrl"
	"github.com/allot-dev/allot/pkg/rules"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"gopkg.in/yaml.v3"
)

var update = flag.Bool("update", false, "rewrite docs/envoy-ratelimit-conformance.md's table from testdata/conformance.yaml")

const (
	conformanceTable = "testdata/conformance.yaml"
	conformanceDoc   = "../../../docs/envoy-ratelimit-conformance.md"
	envoyConfigDir   = "../../../configs/envoy-ratelimit/config"
	docBegin         = "<!-- BEGIN conformance table: generated from pkg/enforcer/grpcapi/testdata/conformance.yaml by TestConformanceDoc -update; do not edit -->"
	docEnd           = "<!-- END conformance table -->"
)

type conformance struct {
	Cases []struct {
		Example int
		Title   string
		Domain  string
		Steps   []conformanceStep
	}
}

type conformanceStep struct {
	Advance    time.Duration
	Every      time.Duration
	Request    []string
	Times      int
	Allot      string
	Last       []string
	Theirs     string
	TheirsLast []string `yaml:"theirs_last"`
	Why        string
}

func loadConformance(t *testing.T) *conformance {
	t.Helper()
	b, err := os.ReadFile(conformanceTable)
	if err != nil {
		t.Fatal(err)
	}
	var c conformance
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("%s: %v", conformanceTable, err)
	}
	for i, cs := range c.Cases {
		for j, st := range cs.Steps {
			where := fmt.Sprintf("%s: case %d (example %d) step %d", conformanceTable, i, cs.Example, j)
			switch {
			case len(st.Request) == 0 || st.Allot == "" || len(st.Last) != len(st.Request):
				t.Fatalf("%s: a step needs request, allot and one last status a descriptor", where)
			case (st.Theirs != "" || st.TheirsLast != nil) != (st.Why != ""):
				t.Fatalf("%s: a difference (theirs, theirs_last) needs its why, and a why a difference", where)
			case st.TheirsLast != nil && len(st.TheirsLast) != len(st.Request):
				t.Fatalf("%s: theirs_last needs one status a descriptor", where)
			}
		}
	}
	return &c
}

// parseDescriptor reads "k=v; k2=v2".
func parseDescriptor(t *testing.T, s string) *ratelimitv3.RateLimitDescriptor {
	t.Helper()
	var kv []string
	for _, e := range strings.Split(s, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(e), "=")
		if !ok {
			t.Fatalf("descriptor %q: entry %q is not key=value", s, e)
		}
		kv = append(kv, k, v)
	}
	return desc(kv...)
}

// renderStatus writes st as the table does: the code, requests_per_unit/unit, and "left
// N" and "reset Ns" when asked.
func renderStatus(st *rlsv3.RateLimitResponse_DescriptorStatus, left, reset bool) string {
	s := st.Code.String()
	if l := st.CurrentLimit; l != nil {
		s += fmt.Sprintf(" %d/%s", l.RequestsPerUnit, strings.ToLower(l.Unit.String()))
	}
	if left {
		s += fmt.Sprintf(" left %d", st.LimitRemaining)
	}
	if reset {
		s += fmt.Sprintf(" reset %ds", st.DurationUntilReset.GetSeconds())
	}
	return s
}

// runs writes a sequence of codes as runs: "OK×3, OVER_LIMIT×1".
func runs(codes []rlsv3.RateLimitResponse_Code) string {
	var parts []string
	for i := 0; i < len(codes); {
		j := i
		for j < len(codes) && codes[j] == codes[i] {
			j++
		}
		parts = append(parts, fmt.Sprintf("%s×%d", codes[i], j-i))
		i = j
	}
	return strings.Join(parts, ", ")
}

// TestConformance runs envoyproxy/ratelimit's README examples, on their configuration,
// against allot's Envoy RLS handler, step by step.
func TestConformance(t *testing.T) {
	c := loadConformance(t)
	cfgs, err := envoyrl.LoadDir(envoyConfigDir)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := rules.Compile(rules.FromEnvoy(cfgs), rules.CompileOptions{Region: "us-east", Now: enforcertest.Start})
	if err != nil {
		t.Fatal(err)
	}
	for i, cs := range c.Cases {
		t.Run(fmt.Sprintf("%d-example%d", i, cs.Example), func(t *testing.T) {
			holder := rules.NewHolder(snap)
			rig := enforcertest.New(t, "rules: []", func(cfg *enforcer.Config) { cfg.Rules = holder })
			s := New(rig.E, Config{})
			for j, st := range cs.Steps {
				rig.Clock.Advance(st.Advance)
				req := &rlsv3.RateLimitRequest{Domain: cs.Domain}
				for _, d := range st.Request {
					req.Descriptors = append(req.Descriptors, parseDescriptor(t, d))
				}
				var codes []rlsv3.RateLimitResponse_Code
				var last *rlsv3.RateLimitResponse
				for range max(st.Times, 1) {
					rig.Clock.Advance(st.Every)
					resp, err := s.ShouldRateLimit(context.Background(), req)
					if err != nil {
						t.Fatalf("step %d: %v", j, err)
					}
					codes, last = append(codes, resp.OverallCode), resp
				}
				if got := runs(codes); got != st.Allot {
					t.Errorf("step %d (%s ×%d): answers %s, the table says %s", j, st.Request, max(st.Times, 1), got, st.Allot)
				}
				for k, want := range st.Last {
					got := renderStatus(last.Statuses[k], strings.Contains(want, " left "), strings.Contains(want, " reset "))
					if got != want {
						t.Errorf("step %d: descriptor %d's status %q, the table says %q", j, k, got, want)
					}
				}
			}
		})
	}
}

// renderConformance writes the table as the doc shows it.
func renderConformance(c *conformance) string {
	var b strings.Builder
	b.WriteString("| example | request (descriptors; × times, every) | allot: answers; statuses of the last | envoyproxy/ratelimit, where different |\n")
	b.WriteString("|---|---|---|---|\n")
	for _, cs := range c.Cases {
		for j, st := range cs.Steps {
			ex := ""
			if j == 0 {
				ex = fmt.Sprintf("%d: %s (`%s`)", cs.Example, cs.Title, cs.Domain)
			}
			var req []string
			for _, d := range st.Request {
				req = append(req, "`"+d+"`")
			}
			r := strings.Join(req, ", ")
			if st.Times > 1 {
				r += fmt.Sprintf(" ×%d", st.Times)
			}
			if st.Every > 0 {
				r += fmt.Sprintf(", every %v", st.Every)
			}
			if st.Advance > 0 {
				r = fmt.Sprintf("+%v: %s", st.Advance, r)
			}
			theirs := ""
			if st.Why != "" {
				ans := st.Theirs
				if ans == "" {
					ans = st.Allot
				}
				lst := st.TheirsLast
				if lst == nil {
					lst = st.Last
				}
				theirs = fmt.Sprintf("%s; %s — **%s**", ans, strings.Join(lst, " · "), st.Why)
			}
			fmt.Fprintf(&b, "| %s | %s | %s; %s | %s |\n", ex, r, st.Allot, strings.Join(st.Last, " · "), theirs)
		}
	}
	return b.String()
}

// TestConformanceDoc holds the doc's table to the test's: they cannot drift. With
// -update it rewrites the doc's table.
func TestConformanceDoc(t *testing.T) {
	c := loadConformance(t)
	doc, err := os.ReadFile(conformanceDoc)
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok1 := strings.Cut(string(doc), docBegin)
	_, after, ok2 := strings.Cut(rest, docEnd)
	if !ok1 || !ok2 {
		t.Fatalf("%s: no table between %q and %q", conformanceDoc, docBegin, docEnd)
	}
	want := renderConformance(c)
	if *update {
		if err := os.WriteFile(conformanceDoc, []byte(before+docBegin+"\n\n"+want+"\n"+docEnd+after), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if got := strings.TrimSpace(rest[:strings.Index(rest, docEnd)]); got != strings.TrimSpace(want) {
		t.Errorf("%s's table is not %s's: run go test ./pkg/enforcer/grpcapi -run TestConformanceDoc -update", conformanceDoc, conformanceTable)
	}
	// Every difference the table names is explained in the doc.
	for _, cs := range c.Cases {
		for _, st := range cs.Steps {
			if st.Why != "" && !strings.Contains(before+after, "**"+st.Why+".**") {
				t.Errorf("%s: the difference %q is not explained (want a paragraph starting **%s.**)", conformanceDoc, st.Why, st.Why)
			}
		}
	}
}
