package testenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// EtcdCluster is a running etcd cluster whose members listen on 127.0.0.1 only. The
// local image runs etcd 3.4 (Debian's etcd-server); the upstream image 3.5. Its methods
// are safe for concurrent use.
type EtcdCluster struct {
	Members []*EtcdMember
}

// EtcdMember is one etcd member in a container. Its URLs never change, across Stop and
// Start too, and a stopped member keeps its data directory. Its methods that change its
// state (Pause, Unpause, Stop, Start) fail the test they are given on error and must not
// be called concurrently with each other.
type EtcdMember struct {
	Name      string // the member name, unique to this cluster
	ClientURL string // "http://127.0.0.1:port"
	PeerURL   string // "http://127.0.0.1:port"

	c *container
}

// httpc talks to etcd's HTTP endpoints for readiness; no keep-alive, so no goroutine
// outlives a probe.
var httpc = &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// Etcd starts an etcd cluster of members members (1, 3 or 5) on 127.0.0.1 free ports,
// removed at t.Cleanup, with etcd's default heartbeat (100 ms) and election timeout
// (1 s). It returns once every member reports healthy (it has a leader) and it fails t
// if that does not happen.
func Etcd(t testing.TB, members int) *EtcdCluster {
	t.Helper()
	Require(t)
	if members != 1 && members != 3 && members != 5 {
		t.Fatalf("testenv: Etcd members = %d, want 1, 3 or 5", members)
	}
	began := time.Now()
	var err error
	for attempt := 0; attempt < startAttempts; attempt++ {
		var e *EtcdCluster
		if e, err = startEtcd(t, members); err == nil {
			t.Logf("testenv: etcd cluster of %d ready in %v", members, time.Since(began).Round(time.Millisecond))
			return e
		}
		if !retryable(err) {
			break
		}
	}
	t.Fatalf("testenv: Etcd: %v", err)
	return nil
}

func startEtcd(t testing.TB, members int) (*EtcdCluster, error) {
	p, err := freePorts(2 * members)
	if err != nil {
		return nil, err
	}
	token := fmt.Sprintf("allot-test-%016x", rand.Uint64())
	e := &EtcdCluster{Members: make([]*EtcdMember, members)}
	initial := make([]string, members)
	for i := range members {
		e.Members[i] = &EtcdMember{
			Name:      fmt.Sprintf("%s-%d", token, i),
			ClientURL: "http://127.0.0.1:" + strconv.Itoa(p[2*i]),
			PeerURL:   "http://127.0.0.1:" + strconv.Itoa(p[2*i+1]),
		}
		initial[i] = e.Members[i].Name + "=" + e.Members[i].PeerURL
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make([]error, members)
	var wg sync.WaitGroup
	for i, m := range e.Members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			argv := []string{etcdBinary(),
				"--name", m.Name,
				"--data-dir", "/tmp/etcd-" + m.Name,
				"--listen-client-urls", m.ClientURL,
				"--advertise-client-urls", m.ClientURL,
				"--listen-peer-urls", m.PeerURL,
				"--initial-advertise-peer-urls", m.PeerURL,
				"--initial-cluster", strings.Join(initial, ","),
				"--initial-cluster-token", token,
				"--initial-cluster-state", "new",
				"--logger", "zap", "--log-outputs", "stderr",
			}
			if m.c, errs[i] = startContainer(t, "etcd", etcdImage(), argv); errs[i] == nil {
				errs[i] = m.waitReady(ctx)
			}
			if errs[i] != nil {
				cancel() // the others need not wait for a cluster that will not form
			}
		}()
	}
	wg.Wait()
	if err := firstCause(errs); err != nil {
		for _, m := range e.Members {
			if m.c != nil {
				m.c.remove()
			}
		}
		return nil, err
	}
	return e, nil
}

// firstCause picks the error that explains a failed start: one that is not just the
// cancellation another member's failure caused.
func firstCause(errs []error) error {
	var fallback error
	for _, err := range errs {
		if err == nil {
			continue
		}
		if !errors.Is(err, context.Canceled) {
			return err
		}
		fallback = err
	}
	return fallback
}

// waitReady polls until the member reports healthy and belongs to this cluster (its
// member list holds its name); errForeign when another etcd answers on the port.
func (m *EtcdMember) waitReady(ctx context.Context) error {
	return m.c.waitFor(ctx, "etcd "+m.ClientURL, func(ctx context.Context) error {
		var members struct {
			Members []struct{ Name string } `json:"members"`
		}
		if err := etcdHTTP(ctx, "POST", m.ClientURL+"/v3/cluster/member/list", &members); err != nil {
			return err
		}
		found := false
		for _, mm := range members.Members {
			found = found || mm.Name == m.Name
		}
		if !found {
			return fmt.Errorf("%w: %s has no member %s", errForeign, m.ClientURL, m.Name)
		}
		var health struct {
			Health string `json:"health"`
			Reason string `json:"reason"`
		}
		if err := etcdHTTP(ctx, "GET", m.ClientURL+"/health", &health); err != nil {
			return err
		}
		if health.Health != "true" {
			return fmt.Errorf("%s: health %q %s", m.ClientURL, health.Health, health.Reason)
		}
		return nil
	})
}

// etcdHTTP calls one of etcd's JSON endpoints and decodes the answer into out.
func etcdHTTP(ctx context.Context, method, url string, out any) error {
	var body *strings.Reader
	if method == "POST" {
		body = strings.NewReader("{}")
	} else {
		body = strings.NewReader("")
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return err
	}
	resp, err := httpc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(out)
}

// Endpoints returns every member's client URL, in Members order.
func (e *EtcdCluster) Endpoints() []string {
	out := make([]string, len(e.Members))
	for i, m := range e.Members {
		out[i] = m.ClientURL
	}
	return out
}

// Client returns a new etcd v3 client for every member, closed at t's cleanup. Options:
// DialTimeout 5 s, DialKeepAliveTime 10 s (gRPC's minimum), DialKeepAliveTimeout 2 s,
// logging discarded.
//
// Outage drills should know: the client balances calls over the members, and a paused
// member keeps its connections open, so a call sent to it hangs until its context ends
// (the client retries no timed-out call). Give each call a timeout and retry; keepalive
// takes the paused member out of rotation after about 12 s.
func (e *EtcdCluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	cl, err := clientv3.New(clientv3.Config{
		Endpoints: e.Endpoints(), DialTimeout: 5 * time.Second,
		DialKeepAliveTime: 10 * time.Second, DialKeepAliveTimeout: 2 * time.Second,
		Logger: zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("testenv: etcd client for %v: %v", e.Endpoints(), err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// Pause freezes the member (docker pause): it stops answering clients and peers.
func (m *EtcdMember) Pause(t testing.TB) {
	t.Helper()
	if err := m.c.pause(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// Unpause resumes a paused member and waits until it reports healthy.
func (m *EtcdMember) Unpause(t testing.TB) {
	t.Helper()
	if err := m.c.unpause(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if err := m.waitReady(context.Background()); err != nil {
		t.Fatalf("testenv: after Unpause: %v", err)
	}
}

// Stop stops the member (SIGTERM, SIGKILL after 10 s); it keeps its data directory.
func (m *EtcdMember) Stop(t testing.TB) {
	t.Helper()
	if err := m.c.stop(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}

// Start starts a stopped member again on the same ports and data directory and waits
// until it reports healthy (which needs a quorum of members running).
func (m *EtcdMember) Start(t testing.TB) {
	t.Helper()
	if err := m.c.start(); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if err := m.waitReady(context.Background()); err != nil {
		t.Fatalf("testenv: after Start: %v", err)
	}
}
