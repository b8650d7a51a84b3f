package report

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/pkg/testenv/poll"
)

func TestCheckAddr(t *testing.T) {
	for _, good := range []string{"127.0.0.1:9000", "balancer.eu-west.internal:7070", "[::1]:1"} {
		if err := CheckAddr(good); err != nil {
			t.Errorf("CheckAddr(%q) = %v", good, err)
		}
	}
	for addr, want := range map[string]string{
		"":               "not host:port",
		"127.0.0.1":      "not host:port",
		":9000":          "empty host",
		"host:":          `port ""`,
		"host:http":      `port "http"`,
		"host:0":         `port "0"`,
		"host:70000":     `port "70000"`,
		"a:1:2":          "not host:port",
		"balancer:9000 ": `port "9000 "`,
	} {
		if err := CheckAddr(addr); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckAddr(%q) = %v, want an error containing %q", addr, err, want)
		}
	}
}

func TestReporterValidateAddrs(t *testing.T) {
	tb := newTable(t, nil)
	c := DefaultReporterConfig()
	c.Table, c.Region, c.EnforcerID, c.Registerer = tb, "r", "e", prometheus.NewRegistry()
	c.Addrs = []string{"a:1", "b:2"}
	if err := c.Validate(); err != nil {
		t.Fatalf("Addrs without Leader: %v", err)
	}
	c.Addrs = []string{"a:1", "b"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "Addrs[1]") || !strings.Contains(err.Error(), `"b"`) {
		t.Fatalf("a bad address: err = %v, want one naming Addrs[1] and the value", err)
	}
	c.Addrs, c.Leader = []string{"a:1"}, StaticLeader("a:1")
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "both") {
		t.Fatalf("Addrs and Leader: err = %v", err)
	}
	c.Addrs, c.Leader = nil, nil
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "Addrs is empty") {
		t.Fatalf("neither: err = %v", err)
	}
}

// walk runs one pass, answering each address as answer says ("ok" accepts, "" fails,
// anything else is a standby's redirect there), and returns the addresses tried.
func walk(r *AddrRing, answer map[string]string) []string {
	var tried []string
	p := r.Pass()
	for a, ok := p.Addr(); ok; a, ok = p.Addr() {
		tried = append(tried, a)
		if answer[a] == "ok" {
			p.Accepted()
			break
		}
		p.Failed(answer[a])
	}
	return tried
}

// The rotation: every attempt starts at the address that last accepted; a failure or a
// standby's answer moves on to the next address, each tried once per attempt; a redirect
// is followed only to an untried address of the list.
func TestAddrRing(t *testing.T) {
	r := NewAddrRing([]string{"a:1", "b:1", "c:1"})
	eq := func(what string, got []string, want ...string) {
		t.Helper()
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s: tried %v, want %v", what, got, want)
		}
	}
	eq("first report, a leads", walk(r, map[string]string{"a:1": "ok"}), "a:1")
	eq("a still leads", walk(r, map[string]string{"a:1": "ok"}), "a:1")
	// a is down, b a standby naming the leader at an address this region cannot reach.
	eq("a down, c leads", walk(r, map[string]string{"b:1": "10.0.0.3:7070", "c:1": "ok"}), "a:1", "b:1", "c:1")
	if r.cur != 2 {
		t.Fatalf("cur %d, want 2 (c accepted)", r.cur)
	}
	eq("the next report goes to c first", walk(r, map[string]string{"c:1": "ok"}), "c:1")
	// c stands by and redirects to b, in the list: b next, not a.
	eq("redirect within the list", walk(r, map[string]string{"c:1": "b:1", "b:1": "ok"}), "c:1", "b:1")
	// Nobody leads: each once, then the pass is over; the next starts at b again.
	eq("no leader", walk(r, map[string]string{}), "b:1", "c:1", "a:1")
	eq("after a failed pass", walk(r, map[string]string{"b:1": "ok"}), "b:1")
	// Standbys redirecting to each other (or to one already tried) never loop.
	eq("redirect loop", walk(r, map[string]string{"b:1": "c:1", "c:1": "b:1", "a:1": "b:1"}), "b:1", "c:1", "a:1")

	// followed says which redirects were taken.
	p := r.Pass()
	p.Addr()
	if p.Failed("elsewhere:1") {
		t.Error("a redirect outside the list was followed")
	}
	if a, _ := p.Addr(); a != "c:1" {
		t.Errorf("after a redirect outside the list: %s, want the next (c:1)", a)
	}
	if !p.Failed("a:1") {
		t.Error("a redirect to an untried address of the list was not followed")
	}

	one := NewAddrRing([]string{"only:1"})
	eq("a list of one", walk(one, map[string]string{}), "only:1")
}

// The Reporter with Addrs: a dead address and a standby whose redirect points outside
// the list are passed over, the leader's address is kept, and when leadership moves the
// reports follow round the list; nothing is ever sent to the advertised address.
func TestReporterAddrsRotate(t *testing.T) {
	advertised := startBalancer(t, true, "") // the leader as it advertises itself: never asked
	lead := startBalancer(t, true, "")
	standby := startBalancer(t, false, advertised.addr)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	_ = lis.Close()
	g := newRig(t, nil, func(c *ReporterConfig) {
		c.Addrs, c.SendTimeout = []string{dead, standby.addr, lead.addr}, 500*time.Millisecond
	})
	g.tb.ObserveTake(rule("default", 10), "key:k1", 3, true, false, 0, t0)
	g.tick(t, 10*time.Second)
	poll.True(t, 10*time.Second, "a report at the leader", func() bool { return len(lead.reports()) == 1 })
	if n := len(standby.reports()); n != 1 {
		t.Fatalf("standby asked %d times, want 1", n)
	}
	g.tick(t, 10*time.Second)
	poll.True(t, 10*time.Second, "a second report at the leader", func() bool { return len(lead.reports()) == 2 })
	if n := len(standby.reports()); n != 1 {
		t.Fatalf("standby asked again (%d): the accepting address should be kept", n)
	}
	poll.True(t, 10*time.Second, "the sent counter", func() bool { return counter(t, g, "allot_usage_reports_sent_total") == 2 })
	if f := counter(t, g, "allot_usage_report_failures_total"); f != 0 {
		t.Fatalf("failures %v: an attempt that lands within the list is not a failure", f)
	}

	// Leadership moves: the old leader now stands by, redirecting to the list's standby,
	// which leads. The report goes lead → standby (a redirect within the list), and stays.
	lead.mu.Lock()
	lead.leader, lead.redirect = false, standby.addr
	lead.mu.Unlock()
	standby.mu.Lock()
	standby.leader = true
	standby.mu.Unlock()
	g.tick(t, 10*time.Second)
	poll.True(t, 10*time.Second, "a report at the new leader", func() bool { return len(standby.reports()) == 2 })
	g.tick(t, 10*time.Second)
	poll.True(t, 10*time.Second, "the next report at the new leader", func() bool { return len(standby.reports()) == 3 })
	if n := len(lead.reports()); n != 3 {
		t.Fatalf("old leader asked %d times, want 3 (twice as leader, once redirecting)", n)
	}
	if v := counter(t, g, "allot_usage_report_redirects_total"); v != 1 {
		t.Fatalf("redirects %v, want 1 (followed within the list)", v)
	}
	if n := len(advertised.reports()); n != 0 {
		t.Fatalf("the advertised address, not in the list, got %d reports", n)
	}
}

// Every address failing: the attempt and its retry each go round the list once, then the
// report is dropped.
func TestReporterAddrsAllDown(t *testing.T) {
	a := startBalancer(t, false, "")
	b := startBalancer(t, false, "10.9.9.9:1")
	g := newRig(t, nil, func(c *ReporterConfig) { c.Addrs = []string{a.addr, b.addr} })
	g.tick(t, 10*time.Second)
	poll.True(t, 10*time.Second, "the drop", func() bool { return counter(t, g, "allot_usage_reports_dropped_total") == 1 })
	if na, nb := len(a.reports()), len(b.reports()); na != 2 || nb != 2 {
		t.Fatalf("calls a %d b %d, want 2 each (the attempt and its retry, once round)", na, nb)
	}
}
