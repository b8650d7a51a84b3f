package testenv

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Links are TCP links with faults on demand: a Toxiproxy server run in this process as a
// library (github.com/Shopify/toxiproxy/v2, no container, no API port). The e2e stack puts
// one on every cross-region path, because this kernel has no netem qdisc to delay
// loopback traffic: a client dials Link.Addr and Toxiproxy forwards to the upstream,
// adding the link's latency each way.
//
// What it guarantees: a Link listens on 127.0.0.1 only; every proxy is stopped (listener
// closed, connections cut) at the cleanup of the test that made the Links. Faults apply to
// connections already open and to new ones. Safe for concurrent use. Known upstream leak
// (v2.5.0): a connection closed while a latency toxic holds data leaves that toxic's
// goroutine blocked for good (toxics/latency.go); a test package whose drills close links
// under load tells its goleak check to ignore toxics.(*LatencyToxic).Pipe (see e2e).
type Links struct {
	server *toxiproxy.ApiServer

	mu    sync.Mutex // mu guards links
	links []*Link
}

// NewLinks starts an empty set of links, stopped at t.Cleanup.
func NewLinks(t testing.TB) *Links {
	t.Helper()
	l := &Links{server: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())}
	t.Cleanup(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, k := range l.links {
			k.p.Stop()
		}
	})
	return l
}

// Link is one proxied path: Addr → Upstream.
type Link struct {
	Name     string
	Addr     string // "127.0.0.1:port", what clients dial
	Upstream string
	Latency  time.Duration // added each way (so a round trip costs 2 × Latency more)

	p *toxiproxy.Proxy

	mu sync.Mutex // mu guards state changes (toxics, start/stop)
}

// Add makes a link to upstream that adds latency (±jitter, uniformly) each way, and
// starts it. Name must be unique in l. It fails t if the proxy cannot listen.
func (l *Links) Add(t testing.TB, name, upstream string, latency, jitter time.Duration) *Link {
	t.Helper()
	var err error
	for attempt := 0; attempt < startAttempts; attempt++ {
		port := Ports(t, 1)[0]
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		p := toxiproxy.NewProxy(l.server, name, addr, upstream)
		if err = p.Start(); err != nil {
			continue // the port was taken in between: another one
		}
		k := &Link{Name: name, Addr: addr, Upstream: upstream, Latency: latency, p: p}
		l.mu.Lock()
		l.links = append(l.links, k)
		l.mu.Unlock()
		if latency > 0 {
			for _, stream := range []string{"upstream", "downstream"} {
				k.addToxic(t, "latency-"+stream, "latency", stream,
					fmt.Sprintf(`{"latency":%d,"jitter":%d}`, latency.Milliseconds(), jitter.Milliseconds()))
			}
		}
		return k
	}
	t.Fatalf("testenv: link %s → %s: %v", name, upstream, err)
	return nil
}

func (k *Link) addToxic(t testing.TB, name, typ, stream, attrs string) {
	t.Helper()
	body := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":%s}`, name, typ, stream, attrs)
	if _, err := k.p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
		t.Fatalf("testenv: link %s: adding toxic %s: %v", k.Name, name, err)
	}
}

func (k *Link) removeToxic(t testing.TB, name string) {
	t.Helper()
	if err := k.p.Toxics.RemoveToxic(context.Background(), name); err != nil {
		t.Fatalf("testenv: link %s: removing toxic %s: %v", k.Name, name, err)
	}
}

// Cut closes the link: open connections are reset and new ones refused, as when the far
// side's host is gone. Restore undoes it.
func (k *Link) Cut(t testing.TB) {
	t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	k.p.Stop()
}

// Restore listens again after Cut, on the same address.
func (k *Link) Restore(t testing.TB) {
	t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.p.Start(); err != nil && err != toxiproxy.ErrProxyAlreadyStarted {
		t.Fatalf("testenv: link %s: restore: %v", k.Name, err)
	}
}

// Blackhole stops all data both ways while keeping connections open (a partition: the
// far side neither answers nor refuses, callers see timeouts). Heal undoes it.
func (k *Link) Blackhole(t testing.TB) {
	t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, stream := range []string{"upstream", "downstream"} {
		k.addToxic(t, "blackhole-"+stream, "timeout", stream, `{"timeout":0}`)
	}
}

// Heal removes a Blackhole.
func (k *Link) Heal(t testing.TB) {
	t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, stream := range []string{"upstream", "downstream"} {
		k.removeToxic(t, "blackhole-"+stream)
	}
}
