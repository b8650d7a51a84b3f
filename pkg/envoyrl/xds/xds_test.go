package xds

import (
	"strings"
	"sync"
	"testing"
	"time"

	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/hashicorp/go-hclog"

	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/envoyrl"
	"github.com/allot-dev/allot/pkg/etcdwatch"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/allot-dev/allot/pkg/testenv/poll"
)

// startMgmt is the shared management server (testenv.XDS) for node "edge-eu".
func startMgmt(t *testing.T, addr string) *testenv.XDS {
	t.Helper()
	return testenv.StartXDS(t, "edge-eu", addr)
}

func limit(unit rlconf.RateLimitUnit, n uint32) *rlconf.RateLimitPolicy {
	return &rlconf.RateLimitPolicy{Unit: unit, RequestsPerUnit: n}
}

// gatewayConfig is what Envoy Gateway generates for a BackendTrafficPolicy: a domain per
// listener, a descriptor tree per rule.
func gatewayConfig(name, domain string, rps uint32) *rlconf.RateLimitConfig {
	return &rlconf.RateLimitConfig{Name: name, Domain: domain, Descriptors: []*rlconf.RateLimitDescriptor{{
		Key: "default/eg/http", Value: "rule-0-match-0",
		Descriptors: []*rlconf.RateLimitDescriptor{{Key: "x-user-id", RateLimit: limit(rlconf.RateLimitUnit_SECOND, rps)}},
	}}}
}

type updates struct {
	mu   sync.Mutex
	sets [][]*envoyrl.Config
}

func (u *updates) add(s []*envoyrl.Config) {
	u.mu.Lock()
	u.sets = append(u.sets, s)
	u.mu.Unlock()
}

func (u *updates) n() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.sets)
}

func (u *updates) last() []*envoyrl.Config {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.sets[len(u.sets)-1]
}

// rpsOf returns the requests_per_unit of the first nested limit of domain's config.
func rpsOf(t *testing.T, set []*envoyrl.Config, domain string) uint32 {
	t.Helper()
	for _, c := range set {
		if c.Domain == domain {
			return c.Descriptors[0].Descriptors[0].RateLimit.RequestsPerUnit
		}
	}
	t.Fatalf("no domain %q in the set", domain)
	return 0
}

func newSource(t *testing.T, addr string, clk clock.Clock, u *updates) *Source {
	t.Helper()
	s, err := New(Config{Server: addr, NodeID: "edge-eu", Update: u.add, Clock: clk, Log: hclog.New(&hclog.LoggerOptions{Output: testWriter{t}}),
		Backoff: etcdwatch.Backoff{Min: time.Second, Max: 4 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestSourceFollowsTheServer(t *testing.T) {
	m := startMgmt(t, "")
	m.Set("1", gatewayConfig("eg-a", "eg-a-domain", 10), gatewayConfig("eg-b", "eg-b-domain", 20))
	var u updates
	s := newSource(t, m.Addr(), clock.NewFake(time.Unix(0, 0)), &u)

	poll.True(t, 10*time.Second, "the first set", func() bool { return u.n() == 1 })
	if set := u.last(); len(set) != 2 || rpsOf(t, set, "eg-a-domain") != 10 || rpsOf(t, set, "eg-b-domain") != 20 {
		t.Fatalf("first set: %+v", set)
	}
	poll.True(t, 10*time.Second, "an ACK of version 1", func() bool {
		a := m.LastAnswer()
		return a != nil && a.GetVersionInfo() == "1" && a.GetErrorDetail() == nil
	})

	// A live change: one resource changed, one removed (state of the world).
	m.Set("2", gatewayConfig("eg-a", "eg-a-domain", 15))
	poll.True(t, 10*time.Second, "the second set", func() bool { return u.n() == 2 })
	if set := u.last(); len(set) != 1 || rpsOf(t, set, "eg-a-domain") != 15 {
		t.Fatalf("second set: %+v", set)
	}
	if st := s.Status(); st.Accepted != 2 || st.Rejected != 0 || st.Err != nil || strings.Join(st.Resources, ",") != "eg-a" {
		t.Fatalf("status %+v", st)
	}
}

// A broken resource never replaces a good one nor holds the others hostage: it keeps its
// last good version, the others are applied, and the response is NACKed naming it.
func TestSourceBrokenResource(t *testing.T) {
	m := startMgmt(t, "")
	m.Set("1", gatewayConfig("eg-a", "eg-a-domain", 10), gatewayConfig("eg-b", "eg-b-domain", 20))
	var u updates
	clk := clock.NewFake(time.Unix(0, 0))
	s := newSource(t, m.Addr(), clk, &u)
	poll.True(t, 10*time.Second, "the first set", func() bool { return u.n() == 1 })

	bad := gatewayConfig("eg-a", "eg-a-domain", 10)
	bad.Descriptors[0].Descriptors[0].RateLimit.Unit = rlconf.RateLimitUnit_UNKNOWN // no unit: refused, as in a file
	never := &rlconf.RateLimitConfig{Name: "eg-c", Domain: ""}                      // no domain
	m.Set("2", bad, gatewayConfig("eg-b", "eg-b-domain", 25), never)
	poll.True(t, 10*time.Second, "the second set", func() bool { return u.n() == 2 })
	// The server sends version 2 again at once on the NACK: the Source answers it after
	// its backoff (on its clock), and applies nothing twice.
	<-s.waited
	set := u.last()
	if len(set) != 2 || rpsOf(t, set, "eg-a-domain") != 10 || rpsOf(t, set, "eg-b-domain") != 25 {
		t.Fatalf("after a broken resource: %+v", set)
	}
	poll.True(t, 10*time.Second, "a NACK of version 2", func() bool {
		a := m.LastAnswer()
		return a != nil && a.GetErrorDetail() != nil
	})
	a := m.LastAnswer()
	msg := a.GetErrorDetail().GetMessage()
	if a.GetVersionInfo() != "1" || !strings.Contains(msg, "xds:eg-a") || !strings.Contains(msg, "xds:eg-c") {
		t.Fatalf("NACK: version %q, message %q", a.GetVersionInfo(), msg)
	}
	if st := s.Status(); st.Rejected != 1 || st.Err == nil {
		t.Fatalf("status %+v", st)
	}

	// Two resources of one domain conflict: nothing changes.
	m.Set("3", gatewayConfig("eg-a", "eg-a-domain", 11), gatewayConfig("eg-b", "eg-a-domain", 12))
	poll.True(t, 10*time.Second, "a NACK of version 3", func() bool {
		clk.Advance(time.Second) // the backoff before the re-NACK of version 2
		return s.Status().Rejected == 2
	})
	if u.n() != 2 {
		t.Fatalf("a conflicting response was applied: %+v", u.last())
	}
	// The Source counts the rejection before its NACK reaches the server: wait for it there
	// (reading it at once failed about one run in twenty).
	poll.True(t, 10*time.Second, "the NACK of version 3 at the server", func() bool {
		return strings.Contains(m.LastAnswer().GetErrorDetail().GetMessage(), "duplicate domain 'eg-a-domain'")
	})

	// A good version after them is acknowledged whole.
	m.Set("4", gatewayConfig("eg-a", "eg-a-domain", 30))
	poll.True(t, 10*time.Second, "an ACK of version 4", func() bool {
		clk.Advance(time.Second)
		a := m.LastAnswer()
		return a.GetVersionInfo() == "4" && a.GetErrorDetail() == nil
	})
	if set := u.last(); len(set) != 1 || rpsOf(t, set, "eg-a-domain") != 30 {
		t.Fatalf("after a good version: %+v", set)
	}
}

// A lost server keeps the configuration in force; the Source reconnects after its backoff
// (on its clock) and takes the new server's state.
func TestSourceReconnects(t *testing.T) {
	m := startMgmt(t, "")
	m.Set("1", gatewayConfig("eg-a", "eg-a-domain", 10))
	var u updates
	clk := clock.NewFake(time.Unix(0, 0))
	s := newSource(t, m.Addr(), clk, &u)
	poll.True(t, 10*time.Second, "the first set", func() bool { return u.n() == 1 })

	m.Stop()
	<-s.waited // the stream ended and the Source waits its backoff
	if u.n() != 1 || len(s.Status().Resources) != 1 {
		t.Fatal("a lost server changed the configuration in force")
	}
	m.Restart()
	m.Set("2", gatewayConfig("eg-a", "eg-a-domain", 40))
	poll.True(t, 10*time.Second, "the reconnect and the new server's set", func() bool {
		clk.Advance(time.Second) // each backoff wait, however many dials fail before the server is up
		return u.n() == 2
	})
	if rpsOf(t, u.last(), "eg-a-domain") != 40 {
		t.Fatalf("after the reconnect: %+v", u.last())
	}
}

func TestFromProtoChecksAsAFile(t *testing.T) {
	cfg, err := FromProto(&rlconf.RateLimitConfig{Name: "r", Domain: "d", Descriptors: []*rlconf.RateLimitDescriptor{
		{Key: "k", Value: "v", ShadowMode: true, RateLimit: &rlconf.RateLimitPolicy{Unit: rlconf.RateLimitUnit_MINUTE, RequestsPerUnit: 7, Name: "a"}},
		{Key: "k", Value: "w", RateLimit: &rlconf.RateLimitPolicy{Unlimited: true, Replaces: []*rlconf.RateLimitReplace{{Name: "a"}}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	d := cfg.Descriptors
	if cfg.Domain != "d" || cfg.File != "xds:r" || len(d) != 2 || !d[0].ShadowMode || d[0].RateLimit.Unit != envoyrl.UnitMinute ||
		d[0].RateLimit.RequestsPerUnit != 7 || !d[1].RateLimit.Unlimited || d[1].RateLimit.Replaces[0] != "a" {
		t.Fatalf("model %+v", cfg)
	}
	for name, pb := range map[string]*rlconf.RateLimitConfig{
		"no name":       {Domain: "d"},
		"no domain":     {Name: "r"},
		"two k_v":       {Name: "r", Domain: "d", Descriptors: []*rlconf.RateLimitDescriptor{{Key: "k", Value: "v"}, {Key: "k", Value: "v"}}},
		"no unit":       {Name: "r", Domain: "d", Descriptors: []*rlconf.RateLimitDescriptor{{Key: "k", RateLimit: limit(rlconf.RateLimitUnit_UNKNOWN, 1)}}},
		"empty key":     {Name: "r", Domain: "d", Descriptors: []*rlconf.RateLimitDescriptor{{Value: "v"}}},
		"replaces self": {Name: "r", Domain: "d", Descriptors: []*rlconf.RateLimitDescriptor{{Key: "k", RateLimit: &rlconf.RateLimitPolicy{Unit: 1, RequestsPerUnit: 1, Name: "x", Replaces: []*rlconf.RateLimitReplace{{Name: "x"}}}}}},
	} {
		if _, err := FromProto(pb); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A field of a newer revision of the resource (here quota_mode, field 7 of a descriptor)
// is named in the warnings, not dropped in silence.
func TestFromProtoNamesUnknownFields(t *testing.T) {
	d := &rlconf.RateLimitDescriptor{Key: "k", RateLimit: limit(rlconf.RateLimitUnit_SECOND, 1)}
	d.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 7, protowire.VarintType), 1))
	cfg, err := FromProto(&rlconf.RateLimitConfig{Name: "r", Domain: "d", Descriptors: []*rlconf.RateLimitDescriptor{d}})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Warnings) != 1 || !strings.Contains(cfg.Warnings[0], "descriptors[0] has fields this allot does not know") {
		t.Fatalf("warnings %q", cfg.Warnings)
	}
}

func TestDecodeRefuses(t *testing.T) {
	if _, err := decode(&anypb.Any{TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster"}); err == nil {
		t.Error("a resource of another type was decoded")
	}
	if _, err := decode(&anypb.Any{TypeUrl: TypeURL, Value: []byte{0xff}}); err == nil {
		t.Error("garbage was decoded")
	}
}

func TestNewRefuses(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no server": {Update: func([]*envoyrl.Config) {}},
		"no update": {Server: "127.0.0.1:1"},
		"backoff":   {Server: "127.0.0.1:1", Update: func([]*envoyrl.Config) {}, Backoff: etcdwatch.Backoff{Min: 2, Max: 1}},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
