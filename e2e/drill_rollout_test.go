package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/e2e/stack"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
)

// The rolling restart's timings: short enough for `make test`, long enough that every
// phase happens (the enforcers' settings, and how often the clients' view is refreshed).
const (
	rollPreStop   = 3 * time.Second        // shutdown.pre_stop_delay: > the clients' view's lag
	rollDrain     = 5 * time.Second        // drain_timeout
	rollMaxAge    = 3 * time.Second        // listen.max_connection_age (±10% by gRPC)
	rollReadiness = 500 * time.Millisecond // how often the clients' view polls /readyz
	rollFailures  = 2                      // failed polls in a row that take an enforcer out (1 s)
	rollSteady    = 8 * time.Second        // load on the new set before the next step: > 2 × max age
	rollRate      = 300                    // checks a second, over both clients
	rollFallback  = 200 * time.Millisecond // fallback.timeout (see TestRollingRestart)
)

// TestRollingRestart (issue 24 §4; docs/drills.md): one region's two enforcers (real
// processes over a real Redis Cluster) are replaced one at a time under steady load, as a
// Kubernetes rolling update with maxUnavailable 1 does: SIGTERM to the old process, wait
// until it has exited, start the new one (a new id and new ports), wait until it is
// ready, the next. The enforcers run with shutdown.pre_stop_delay and
// listen.max_connection_age. Two clients share the load, each with grpc-go's own GOAWAY
// handling (no new call on a connection going away; a call the server refused
// unprocessed retried on another connection, transparently) and nothing on top:
//
//   - "endpoints", as an Envoy is given the region over EDS from Kubernetes endpoints: the
//     ready enforcers (/readyz polled every 500 ms; out after 2 failures), a connection
//     to each, and each check sent to the next of them, round robin, on its connection,
//     failing if that connection cannot be made (an Envoy's request assigned to an
//     upstream host fails on a connect error);
//   - "service": one address, a TCP proxy that hands each new connection to the next
//     ready enforcer (a ClusterIP Service; an Envoy cluster of one DNS name): its checks
//     move to another enforcer only when the enforcer ends the connection, by its age or
//     by the drain.
//
// Promise: no check is lost: 0 errors at either client and 0 answers from fallback (or any
// local source); each old process exits 0 within pre_stop_delay + drain_timeout; each new
// enforcer answers both clients' checks; the service client's connection is renewed by
// max_connection_age, not only by the drains. Without the pre-stop delay the endpoints
// client loses the checks it sends to a stopped enforcer until its polls notice.
func TestRollingRestart(t *testing.T) {
	began := time.Now()
	opt := stack.DefaultOptions()
	opt.Regions = opt.Regions[:1] // us-east, two enforcers; the rules still name every region
	opt.EtcdMembers = 1
	// A check waits this long for Redis before it is answered locally (and each call gets
	// twice that before it counts against the shard's breaker): the shipped 5 ms, and even
	// 50 ms, are missed now and then by a 2-core machine at a load average of 20 with no
	// restart at all (two shards silent for 50 ms at once, seen in a run), which is not what
	// this drill judges (docs/drills.md). A restart that sent checks to fallback (a new
	// enforcer answering before it reaches Redis, a breaker opened by a stop) still would.
	opt.FallbackTimeout = rollFallback
	opt.Enforcer = fmt.Sprintf("{regions: [%s], shutdown: {pre_stop_delay: %v}, drain_timeout: %v, listen: {max_connection_age: %v}, fallback: {reply_timeout: %v}}",
		strings.Join(stack.Regions, ", "), rollPreStop, rollDrain, rollMaxAge, 2*rollFallback)
	s := stack.Start(t, opt)
	r := s.Regions[0]

	hosts := &hostPools{conns: map[string]*grpc.ClientConn{}}
	defer hosts.close()
	ep := watchEndpoints(r.Enforcers, hosts.update)
	defer ep.close()
	vip := serveVIP(t, ep.next)
	defer vip.close()
	serviceCC, err := grpc.NewClient(vip.ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer serviceCC.Close()
	service := allotv1.NewAllotClient(serviceCC)

	load := startRollLoad(map[string]*rollClient{
		"endpoints": {check: hosts.check, by: func(p *peer.Peer) string { return ep.idOf(p.Addr.String()) }},
		"service": {check: func(ctx context.Context, req *allotv1.CheckRequest, p *peer.Peer) (*allotv1.CheckResponse, error) {
			return service.Check(ctx, req, grpc.Peer(p))
		}, by: func(p *peer.Peer) string { return vip.idOf(p.LocalAddr.String()) }},
	})
	loadStarted := time.Now()
	steady := func(d time.Duration) { // a phase of the load, not a wait for a server
		tm := time.NewTimer(d)
		defer tm.Stop()
		<-tm.C
	}
	steady(rollSteady / 2)
	var replaced []string
	for i, old := range slices.Clone(r.Enforcers) {
		at := time.Since(loadStarted)
		stopAt := time.Now()
		old.Proc.Stop(t) // SIGTERM; returns when the process has exited (SIGKILL after 10 s)
		stopped := time.Since(stopAt)
		st := old.Proc.Status(t)
		logs := old.Proc.Logs(40)
		t.Logf("rollout: +%.1fs SIGTERM to %s: exited %d after %v", at.Seconds(), old.ID, st.ExitCode, stopped.Round(time.Millisecond))
		if st.Running || st.ExitCode != 0 {
			t.Errorf("%s after SIGTERM: running %v, exit code %d, want exited 0; last log lines:\n%s", old.ID, st.Running, st.ExitCode, logs)
		}
		if bound := rollPreStop + rollDrain; stopped > bound+2*time.Second {
			t.Errorf("%s took %v to exit after SIGTERM, want within pre_stop_delay + drain_timeout (%v) + 2 s", old.ID, stopped, bound)
		}
		if stopped < rollPreStop {
			t.Errorf("%s exited %v after SIGTERM, before its pre-stop delay of %v was over", old.ID, stopped, rollPreStop)
		}
		for _, want := range []string{"stopping: pre-stop delay", "stopped"} {
			if !strings.Contains(logs, want) {
				t.Errorf("%s never logged %q; last log lines:\n%s", old.ID, want, logs)
			}
		}
		startAt := time.Now()
		nu := s.StartEnforcer(t, r, len(r.Enforcers)+1+i) // waits for its /readyz
		t.Logf("rollout: +%.1fs %s started, ready after %v", time.Since(loadStarted).Seconds(), nu.ID, time.Since(startAt).Round(time.Millisecond))
		ep.add(nu)
		replaced = append(replaced, nu.ID)
		steady(rollSteady)
	}
	res := load.stop()
	t.Logf("rollout: load %.1fs, the stack and the restarts %v in all", res.elapsed.Seconds(), time.Since(began).Round(time.Second))

	for _, name := range []string{"endpoints", "service"} {
		c := res.clients[name]
		t.Logf("rollout: %s client: %d checks, %d errors, %d from local sources (%v), p99 %v, max %v; answered by %v",
			name, c.calls, c.errors, c.local, c.sources, c.quantile(0.99), c.quantile(1), c.by)
		if len(c.odd) > 0 {
			t.Logf("rollout: %s client's errors and local answers (the first 20), from the start of the load:\n  %s", name, strings.Join(c.odd, "\n  "))
		}
		if c.errors > 0 {
			t.Errorf("%s client: %d of %d checks failed (first: %v), want 0", name, c.errors, c.calls, c.firstErr)
		}
		if c.local > 0 {
			t.Errorf("%s client: %d of %d checks answered from local sources (%v), want 0", name, c.local, c.calls, c.sources)
		}
		if c.calls < int64(rollRate/2*res.elapsed.Seconds()*0.9) {
			t.Errorf("%s client: %d checks in %.1fs, want about %d a second: the load generator fell behind (%d not sent)",
				name, c.calls, res.elapsed.Seconds(), rollRate/2, res.unsent)
		}
		for _, id := range replaced {
			if c.by[id] == 0 {
				t.Errorf("%s client: no check answered by %s, a new enforcer", name, id)
			}
		}
	}
	conns := vip.connections()
	t.Logf("rollout: the service client made %d connections (max_connection_age %v; the drains alone would make 3)", conns, rollMaxAge)
	if conns <= 4 {
		t.Errorf("the service client made %d connections over %.0fs: max_connection_age %v did not renew them", conns, res.elapsed.Seconds(), rollMaxAge)
	}
	t.Logf("rollout: out of rotation / back, as the clients saw /readyz:%s", ep.history())
}

// rollClient is one client of the rolling restart's load.
type rollClient struct {
	check func(context.Context, *allotv1.CheckRequest, *peer.Peer) (*allotv1.CheckResponse, error)
	by    func(*peer.Peer) string // which enforcer answered

	calls, errors, local int64
	firstErr             error
	sources              map[string]int64
	byID                 map[string]int64
	latencies            []time.Duration
	odd                  []string // when and where each error or local answer came, for the log
}

type rollTally struct {
	calls, errors, local int64
	firstErr             error
	sources, by          map[string]int64
	latencies            []time.Duration // sorted
	odd                  []string
}

func (c *rollTally) quantile(q float64) time.Duration {
	if len(c.latencies) == 0 {
		return 0
	}
	return c.latencies[int(q*float64(len(c.latencies)-1))].Round(100 * time.Microsecond)
}

type rollResult struct {
	clients map[string]*rollTally
	elapsed time.Duration
	unsent  int64
}

// rollLoad offers rollRate checks a second, alternating between the clients, over a pool
// of workers, until stop; bounded in time (3 minutes) and count whatever happens.
type rollLoad struct {
	mu      sync.Mutex // mu guards clients' tallies
	clients map[string]*rollClient
	quit    chan struct{}
	done    chan struct{}
	began   time.Time
	unsent  int64
}

func startRollLoad(clients map[string]*rollClient) *rollLoad {
	l := &rollLoad{clients: clients, quit: make(chan struct{}), done: make(chan struct{}), began: time.Now()}
	names := make([]string, 0, len(clients))
	for n, c := range clients {
		names = append(names, n)
		c.sources, c.byID = map[string]int64{}, map[string]int64{}
	}
	slices.Sort(names)
	const workers, maxRun = 32, 3 * time.Minute
	jobs := make(chan int64, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range jobs {
				name := names[i%int64(len(names))]
				l.one(name, clients[name], i)
			}
		})
	}
	go func() {
		defer close(l.done)
		defer wg.Wait()
		defer close(jobs)
		tk := time.NewTicker(10 * time.Millisecond)
		defer tk.Stop()
		end := time.NewTimer(maxRun)
		defer end.Stop()
		for i := int64(0); i < int64(rollRate*maxRun/time.Second); {
			select {
			case <-l.quit:
				return
			case <-end.C:
				return
			case <-tk.C:
			}
			// Every call due by now, however late this tick (a starved machine drops ticks).
			for range int64(time.Since(l.began).Seconds()*rollRate) - i {
				select {
				case jobs <- i:
				default:
					l.mu.Lock()
					l.unsent++ // every worker busy: counted, not queued (no coordinated omission)
					l.mu.Unlock()
				}
				i++
			}
		}
	}()
	return l
}

func (l *rollLoad) one(name string, c *rollClient, i int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var p peer.Peer
	start := time.Now()
	resp, err := c.check(ctx, &allotv1.CheckRequest{ApiKey: fmt.Sprintf("roll-%s-%d", name, i%64), Plan: "drill"}, &p)
	took := time.Since(start)
	l.mu.Lock()
	defer l.mu.Unlock()
	c.calls++
	c.latencies = append(c.latencies, took)
	by := "?"
	if p.Addr != nil {
		by = c.by(&p)
	}
	at := start.Sub(l.began).Seconds()
	if err != nil {
		c.errors++
		if c.firstErr == nil {
			c.firstErr = err
		}
		if len(c.odd) < 20 {
			c.odd = append(c.odd, fmt.Sprintf("+%.2fs %s error %v", at, by, err))
		}
		return
	}
	src := stack.SourceName(resp.GetSource())
	c.sources[src]++
	c.byID[by]++
	switch src {
	case "fallback", "fail-open", "fail-closed":
		c.local++
		if len(c.odd) < 20 {
			c.odd = append(c.odd, fmt.Sprintf("+%.2fs %s %s after %v", at, by, src, took.Round(time.Millisecond)))
		}
	}
}

// stop ends the load and returns what each client saw.
func (l *rollLoad) stop() rollResult {
	close(l.quit)
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	out := rollResult{clients: map[string]*rollTally{}, elapsed: time.Since(l.began), unsent: l.unsent}
	for n, c := range l.clients {
		lat := slices.Clone(c.latencies)
		slices.Sort(lat)
		out.clients[n] = &rollTally{calls: c.calls, errors: c.errors, local: c.local, firstErr: c.firstErr,
			sources: c.sources, by: c.byID, latencies: lat, odd: c.odd}
	}
	return out
}

// hostPools is the endpoints client: a gRPC connection per enforcer it was told of (an
// Envoy's connection pool per upstream host), and each check sent to the next host of
// the last list, round robin. A host that leaves the list keeps its connection until
// close, so the calls on it finish, as Envoy drains it.
type hostPools struct {
	mu    sync.Mutex // mu guards conns, hosts and rr
	conns map[string]*grpc.ClientConn
	hosts []string
	rr    int
}

// update is the list of hosts from now on.
func (h *hostPools) update(ready []*stack.Enforcer) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hosts = h.hosts[:0]
	for _, e := range ready {
		if h.conns[e.GRPC] == nil {
			cc, err := grpc.NewClient(e.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				continue // a malformed address: never, for the stack's
			}
			h.conns[e.GRPC] = cc
		}
		h.hosts = append(h.hosts, e.GRPC)
	}
}

func (h *hostPools) check(ctx context.Context, req *allotv1.CheckRequest, p *peer.Peer) (*allotv1.CheckResponse, error) {
	h.mu.Lock()
	if len(h.hosts) == 0 {
		h.mu.Unlock()
		return nil, errors.New("no enforcer in the endpoints")
	}
	h.rr++
	cc := h.conns[h.hosts[h.rr%len(h.hosts)]]
	h.mu.Unlock()
	return allotv1.NewAllotClient(cc).Check(ctx, req, grpc.Peer(p))
}

func (h *hostPools) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, cc := range h.conns {
		cc.Close()
	}
}

// endpoints is the clients' view of the region: the ready enforcers as Kubernetes
// endpoints list them (poll), given to onChange when they change (as EDS gives them to an
// Envoy) and to the VIP. Its goroutine polls until close.
type endpoints struct {
	onChange func([]*stack.Enforcer)

	polling sync.Mutex // one poll at a time, so an older answer never overwrites a newer

	mu      sync.Mutex // mu guards members, failed, ready, rr and events
	members []*stack.Enforcer
	failed  map[*stack.Enforcer]int // failed polls in a row
	ready   []*stack.Enforcer       // in members' order
	rr      int
	events  []string

	began time.Time
	quit  chan struct{}
	done  chan struct{}
}

func watchEndpoints(es []*stack.Enforcer, onChange func([]*stack.Enforcer)) *endpoints {
	ep := &endpoints{onChange: onChange, members: slices.Clone(es), failed: map[*stack.Enforcer]int{},
		began: time.Now(), quit: make(chan struct{}), done: make(chan struct{})}
	ep.poll() // the first state, before any client dials
	go func() {
		defer close(ep.done)
		tk := time.NewTicker(rollReadiness)
		defer tk.Stop()
		for {
			select {
			case <-ep.quit:
				return
			case <-tk.C:
				ep.poll()
			}
		}
	}()
	return ep
}

// poll asks every member's /readyz, as a Kubernetes readiness probe does (1 s timeout): a
// member is ready from its first 200 until rollFailures polls in a row fail; when the
// ready set changed, it says so.
func (ep *endpoints) poll() {
	ep.polling.Lock()
	defer ep.polling.Unlock()
	ep.mu.Lock()
	members := slices.Clone(ep.members)
	ep.mu.Unlock()
	ok := make([]bool, len(members))
	var probes sync.WaitGroup
	for i, e := range members {
		probes.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			code, _, err := e.Get(ctx, "/readyz")
			ok[i] = err == nil && code == http.StatusOK
		})
	}
	probes.Wait()
	ep.mu.Lock()
	var ready []*stack.Enforcer
	for i, e := range members {
		if ok[i] {
			ep.failed[e] = 0
		} else {
			ep.failed[e]++
		}
		if ep.failed[e] < rollFailures && (ok[i] || slices.Contains(ep.ready, e)) {
			ready = append(ready, e)
		}
	}
	changed := !slices.Equal(ready, ep.ready)
	if changed {
		var ids []string
		for _, e := range ready {
			ids = append(ids, e.ID)
		}
		ep.events = append(ep.events, fmt.Sprintf("\n  +%5.1fs ready: %s", time.Since(ep.began).Seconds(), strings.Join(ids, ", ")))
	}
	ep.ready = ready
	ep.mu.Unlock()
	if changed {
		ep.onChange(ready)
	}
}

// add makes a new enforcer part of the region the clients see (once it is ready).
func (ep *endpoints) add(e *stack.Enforcer) {
	ep.mu.Lock()
	ep.members = append(ep.members, e)
	ep.mu.Unlock()
	ep.poll()
}

// next is the ready enforcer the VIP gives the next connection to, round robin.
func (ep *endpoints) next() (*stack.Enforcer, bool) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if len(ep.ready) == 0 {
		return nil, false
	}
	ep.rr++
	return ep.ready[ep.rr%len(ep.ready)], true
}

// idOf names the enforcer at gRPC address addr.
func (ep *endpoints) idOf(addr string) string {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	for _, e := range ep.members {
		if e.GRPC == addr {
			return e.ID
		}
	}
	return addr
}

func (ep *endpoints) history() string {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return strings.Join(ep.events, "")
}

func (ep *endpoints) close() {
	close(ep.quit)
	<-ep.done
}

// vip is a TCP proxy in front of the ready enforcers, as a ClusterIP Service is: each
// connection goes to one enforcer, chosen when it is made, for as long as it lasts. Its
// goroutines end at close.
type vip struct {
	ln   net.Listener
	next func() (*stack.Enforcer, bool)

	mu    sync.Mutex // mu guards conns, via and made
	conns map[net.Conn]struct{}
	via   map[string]string // client address → enforcer id
	made  int
	wg    sync.WaitGroup
}

func serveVIP(t *testing.T, next func() (*stack.Enforcer, bool)) *vip {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	v := &vip{ln: ln, next: next, conns: map[net.Conn]struct{}{}, via: map[string]string{}}
	v.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			v.wg.Go(func() { v.pipe(c) })
		}
	})
	return v
}

func (v *vip) pipe(c net.Conn) {
	e, ok := v.next()
	if !ok {
		c.Close()
		return
	}
	b, err := net.DialTimeout("tcp", e.GRPC, time.Second)
	if err != nil {
		c.Close()
		return
	}
	v.mu.Lock()
	v.conns[c], v.conns[b] = struct{}{}, struct{}{}
	v.via[c.RemoteAddr().String()] = e.ID
	v.made++
	v.mu.Unlock()
	var once sync.Once
	end := func() { once.Do(func() { c.Close(); b.Close() }) }
	var copies sync.WaitGroup
	copies.Go(func() { io.Copy(b, c); end() }) //nolint:errcheck // a closed side ends both
	copies.Go(func() { io.Copy(c, b); end() }) //nolint:errcheck
	copies.Wait()
	v.mu.Lock()
	delete(v.conns, c)
	delete(v.conns, b)
	v.mu.Unlock()
}

// idOf names the enforcer that the connection from client address addr went to.
func (v *vip) idOf(addr string) string {
	v.mu.Lock()
	defer v.mu.Unlock()
	if id, ok := v.via[addr]; ok {
		return id
	}
	return "?" + addr
}

func (v *vip) connections() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.made
}

func (v *vip) close() {
	v.ln.Close()
	v.mu.Lock()
	for c := range v.conns {
		c.Close()
	}
	v.mu.Unlock()
	v.wg.Wait()
}
