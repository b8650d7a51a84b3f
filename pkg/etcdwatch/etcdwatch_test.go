package etcdwatch

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/clock"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestBackoff(t *testing.T) {
	ms := time.Millisecond
	low := func(int64) int64 { return 0 }
	high := func(n int64) int64 { return n - 1 }
	for _, tc := range []struct {
		name  string
		b     Backoff
		steps []string // "next" or "reset"
		want  []time.Duration
	}{
		{"doubles to Max", Backoff{Min: 100 * ms, Max: time.Second},
			[]string{"next", "next", "next", "next", "next", "next"}, []time.Duration{100, 200, 400, 800, 1000, 1000}},
		{"reset starts from Min", Backoff{Min: 100 * ms, Max: time.Second},
			[]string{"next", "next", "reset", "next", "next"}, []time.Duration{100, 200, 100, 200}},
		{"Min == Max", Backoff{Min: 50 * ms, Max: 50 * ms},
			[]string{"next", "next"}, []time.Duration{50, 50}},
		{"jitter, lowest draw: half", Backoff{Min: 100 * ms, Max: time.Second, Jitter: true, rnd: low},
			[]string{"next", "next", "next", "next", "next", "next"}, []time.Duration{50, 100, 200, 400, 500, 500}},
		{"jitter, highest draw: the whole wait", Backoff{Min: 100 * ms, Max: time.Second, Jitter: true, rnd: high},
			[]string{"next", "next", "next", "next", "next", "next"}, []time.Duration{100, 200, 400, 800, 1000, 1000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.b
			var got []time.Duration
			for _, s := range tc.steps {
				if s == "reset" {
					b.Reset()
					continue
				}
				got = append(got, b.Next()/ms)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("waits %v ms, want %v ms", got, tc.want)
			}
		})
	}
}

func TestJitterStaysInRange(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: 400 * time.Millisecond, Jitter: true}
	for i := range 50 {
		base := min(100*time.Millisecond<<min(i, 2), 400*time.Millisecond)
		if d := b.Next(); d < base/2 || d > base {
			t.Fatalf("wait %d: %v, want in [%v, %v]", i, d, base/2, base)
		}
	}
}

func TestNewRejects(t *testing.T) {
	good := Config{Prefix: "/p/", Timeout: time.Second, Backoff: Backoff{Min: time.Millisecond, Max: time.Second}, Clock: clock.Real()}
	h := Handler{OnList: func(context.Context, []*mvccpb.KeyValue, int64) {}, OnEvents: func(context.Context, []*clientv3.Event, int64) {}}
	if _, err := New(&fakeEtcd{}, good, h); err != nil {
		t.Fatalf("a good config: %v", err)
	}
	for _, tc := range []struct {
		mod  func(*Config, *Handler)
		want string
	}{
		{func(c *Config, _ *Handler) { c.Prefix = "" }, "Prefix is empty"},
		{func(c *Config, _ *Handler) { c.Timeout = 0 }, "Timeout 0s"},
		{func(c *Config, _ *Handler) { c.Backoff.Max = 0 }, "Backoff 1ms..0s"},
		{func(c *Config, _ *Handler) { c.Clock = nil }, "Clock is nil"},
		{func(_ *Config, h *Handler) { h.OnEvents = nil }, "OnList and OnEvents are required"},
		{func(c *Config, _ *Handler) { c.ProbeEvery = time.Second }, "OnProbe is nil"},
	} {
		c, hh := good, h
		tc.mod(&c, &hh)
		if _, err := New(&fakeEtcd{}, c, hh); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New = %v, want an error saying %q", err, tc.want)
		}
	}
}

// fakeEtcd hands each Get and Watch to the test, which answers it: the loop's revision
// bookkeeping and backoff are tested without etcd.
type fakeEtcd struct {
	gets    chan getCall
	watches chan watchCall
}

type getCall struct {
	reply chan getReply
}

type getReply struct {
	resp *clientv3.GetResponse
	err  error
}

type watchCall struct {
	from     int64
	progress bool
	ch       chan clientv3.WatchResponse // the test sends responses here, or closes it
}

func (f *fakeEtcd) Get(ctx context.Context, _ string, _ ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	c := getCall{reply: make(chan getReply, 1)}
	select {
	case f.gets <- c:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case r := <-c.reply:
		return r.resp, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Watch returns a channel that, like etcd's, closes when ctx ends.
func (f *fakeEtcd) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	op := clientv3.OpGet(key, opts...)
	in, out := make(chan clientv3.WatchResponse), make(chan clientv3.WatchResponse)
	go func() {
		defer close(out)
		for {
			select {
			case wr, ok := <-in:
				if !ok {
					return
				}
				select {
				case out <- wr:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	select {
	case f.watches <- watchCall{from: op.Rev(), progress: op.IsProgressNotify(), ch: in}:
	case <-ctx.Done():
	}
	return out
}

// rig runs a Loop on a fakeEtcd and a fake clock; every Handler call is sent to calls as
// a line, so the test sees them one at a time, in order.
type rig struct {
	t     *testing.T
	f     *fakeEtcd
	clk   *clock.Fake
	calls chan string
	l     *Loop
}

const prefix = "/p/"

func newRig(t *testing.T, mod func(*Config)) *rig {
	g := &rig{t: t, f: &fakeEtcd{gets: make(chan getCall), watches: make(chan watchCall)},
		clk: clock.NewFake(time.Unix(1000, 0)), calls: make(chan string)}
	cfg := Config{Prefix: prefix, Timeout: time.Second, Clock: g.clk,
		Backoff: Backoff{Min: 100 * time.Millisecond, Max: 400 * time.Millisecond}}
	if mod != nil {
		mod(&cfg)
	}
	send := func(ctx context.Context, s string) {
		select {
		case g.calls <- s:
		case <-ctx.Done(): // the test has ended the loop
		}
	}
	h := Handler{
		OnList: func(ctx context.Context, kvs []*mvccpb.KeyValue, rev int64) {
			keys := make([]string, len(kvs))
			for i, kv := range kvs {
				keys[i] = string(kv.Key)
			}
			send(ctx, fmt.Sprintf("list rev=%d keys=%s", rev, strings.Join(keys, ",")))
		},
		OnEvents: func(ctx context.Context, evs []*clientv3.Event, rev int64) {
			s := fmt.Sprintf("events rev=%d", rev)
			for _, ev := range evs {
				s += fmt.Sprintf(" %s %s@%d", ev.Type, ev.Kv.Key, ev.Kv.ModRevision)
			}
			send(ctx, s)
		},
		OnError: func(ctx context.Context, f Failure) {
			send(ctx, fmt.Sprintf("error listing=%v compacted=%v retry=%v: %v", f.Listing, f.Compacted, f.RetryIn, f.Err))
		},
		OnProbe: func(ctx context.Context) { send(ctx, "probe") },
	}
	l, err := New(g.f, cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	g.l = l
	return g
}

// run starts Run and returns a stop that ends it and waits for it.
func (g *rig) run() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); g.l.Run(ctx) }()
	return func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			g.t.Fatal("Run did not return within 5s of its context ending")
		}
	}
}

func (g *rig) expect(want string) {
	g.t.Helper()
	select {
	case got := <-g.calls:
		if got != want {
			g.t.Fatalf("handler got\n\t%s\nwant\n\t%s", got, want)
		}
	case <-time.After(5 * time.Second):
		g.t.Fatalf("no handler call within 5s; want %s", want)
	}
}

// get waits for the loop's next list and answers it with rev and keys, or err.
func (g *rig) get(rev int64, err error, keys ...string) {
	g.t.Helper()
	var c getCall
	select {
	case c = <-g.f.gets:
	case w := <-g.f.watches:
		g.t.Fatalf("the loop watched from %d, want a list", w.from)
	case <-time.After(5 * time.Second):
		g.t.Fatal("no list within 5s")
	}
	if err != nil {
		c.reply <- getReply{err: err}
		return
	}
	resp := &clientv3.GetResponse{Header: &pb.ResponseHeader{Revision: rev}}
	for _, k := range keys {
		resp.Kvs = append(resp.Kvs, &mvccpb.KeyValue{Key: []byte(k), ModRevision: rev})
	}
	c.reply <- getReply{resp: resp}
}

// watch waits for the loop's next watch and checks where it starts.
func (g *rig) watch(from int64, progress bool) chan clientv3.WatchResponse {
	g.t.Helper()
	select {
	case w := <-g.f.watches:
		if w.from != from || w.progress != progress {
			g.t.Fatalf("watch from %d (progress notify %v), want from %d (%v)", w.from, w.progress, from, progress)
		}
		return w.ch
	case <-g.f.gets:
		g.t.Fatalf("the loop listed, want a watch from %d", from)
	case <-time.After(5 * time.Second):
		g.t.Fatalf("no watch within 5s; want one from %d", from)
	}
	return nil
}

// advance moves the fake clock by d once the loop waits for a timer d from now.
func (g *rig) advance(d time.Duration) {
	g.t.Helper()
	at := g.clk.Now().Add(d)
	deadline := time.Now().Add(5 * time.Second)
	for !g.clk.Waiting(at) {
		if time.Now().After(deadline) {
			g.t.Fatalf("the loop does not wait until %v (+%v)", at, d)
		}
		runtime.Gosched()
	}
	g.clk.Advance(d)
}

func put(key string, rev int64) *clientv3.Event {
	return &clientv3.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(key), ModRevision: rev}}
}

// TestLoop walks the loop through list failures (backing off), a list, events, a
// progress notification, probes, a compaction (listing again at once), a closed watch
// channel and a cancelled watch (backing off from Min again after the list between).
func TestLoop(t *testing.T) {
	g := newRig(t, func(c *Config) { c.ProgressNotify, c.ProbeEvery = true, time.Second })
	stop := g.run()
	defer stop()
	unavailable := errors.New("unavailable")

	g.get(0, unavailable)
	g.expect("error listing=true compacted=false retry=100ms: while listing /p/ in etcd: unavailable")
	g.advance(100 * time.Millisecond)
	g.get(0, unavailable)
	g.expect("error listing=true compacted=false retry=200ms: while listing /p/ in etcd: unavailable")
	g.advance(200 * time.Millisecond)
	g.get(10, nil, "/p/a", "/p/b")
	g.expect("list rev=10 keys=/p/a,/p/b")

	ch := g.watch(11, true)
	ch <- clientv3.WatchResponse{Header: &pb.ResponseHeader{Revision: 12}, Events: []*clientv3.Event{put("/p/c", 12)}}
	g.expect("events rev=12 PUT /p/c@12")
	ch <- clientv3.WatchResponse{Header: &pb.ResponseHeader{Revision: 15}} // progress notification
	g.expect("events rev=15")
	g.advance(time.Second)
	g.expect("probe")
	g.advance(time.Second)
	g.expect("probe")

	ch <- clientv3.WatchResponse{CompactRevision: 13}
	g.expect("error listing=false compacted=true retry=0s: while watching /p/ from revision 11: etcdserver: mvcc: required revision has been compacted")
	g.get(20, nil, "/p/a")
	g.expect("list rev=20 keys=/p/a")

	ch = g.watch(21, true)
	close(ch)
	g.expect("error listing=false compacted=false retry=100ms: while watching /p/ from revision 21: etcdwatch: watch channel closed")
	g.advance(100 * time.Millisecond)
	g.get(0, unavailable)
	g.expect("error listing=true compacted=false retry=200ms: while listing /p/ in etcd: unavailable")
	g.advance(200 * time.Millisecond)
	g.get(30, nil)
	g.expect("list rev=30 keys=")

	ch = g.watch(31, true)
	ch <- clientv3.WatchResponse{Canceled: true}
	g.expect("error listing=false compacted=false retry=100ms: while watching /p/ from revision 31: etcdserver: mvcc: required revision is a future revision")
	g.advance(100 * time.Millisecond)
	g.get(40, nil)
	g.expect("list rev=40 keys=")
	g.watch(41, true)
}

// TestRunAfterList: after the owner's own List, Run's first watch starts after the
// revision List returned, without a list; the next failure lists as usual.
func TestRunAfterList(t *testing.T) {
	g := newRig(t, nil)
	listed := make(chan error, 1)
	go func() { _, _, err := g.l.List(context.Background()); listed <- err }()
	g.get(42, nil, "/p/x")
	if err := <-listed; err != nil {
		t.Fatal(err)
	}
	stop := g.run()
	defer stop()
	ch := g.watch(43, false)
	ch <- clientv3.WatchResponse{Header: &pb.ResponseHeader{Revision: 44}, Events: []*clientv3.Event{put("/p/x", 44)}}
	g.expect("events rev=44 PUT /p/x@44")
	ch <- clientv3.WatchResponse{CompactRevision: 44}
	g.expect("error listing=false compacted=true retry=0s: while watching /p/ from revision 43: etcdserver: mvcc: required revision has been compacted")
	g.get(50, nil, "/p/x")
	g.expect("list rev=50 keys=/p/x")
	g.watch(51, false)
}

// TestStopsQuietly: a loop whose context ends while it lists or waits returns without
// reporting an error (stop would time out on a handler call nobody takes).
func TestStopsQuietly(t *testing.T) {
	t.Run("while listing", func(t *testing.T) {
		g := newRig(t, nil)
		stop := g.run()
		<-g.f.gets // the list is under way; its answer never comes
		stop()
	})
	t.Run("while backing off", func(t *testing.T) {
		g := newRig(t, nil)
		stop := g.run()
		g.get(0, errors.New("unavailable"))
		g.expect("error listing=true compacted=false retry=100ms: while listing /p/ in etcd: unavailable")
		stop()
	})
	t.Run("while watching", func(t *testing.T) {
		g := newRig(t, nil)
		stop := g.run()
		g.get(7, nil)
		g.expect("list rev=7 keys=")
		g.watch(8, false)
		stop()
	})
}

func TestList(t *testing.T) {
	g := newRig(t, nil)
	type result struct {
		kvs []*mvccpb.KeyValue
		rev int64
		err error
	}
	res := make(chan result, 1)
	go func() { kvs, rev, err := g.l.List(context.Background()); res <- result{kvs, rev, err} }()
	g.get(9, nil, "/p/a")
	if r := <-res; r.err != nil || r.rev != 9 || len(r.kvs) != 1 {
		t.Fatalf("List = %d keys at %d, %v", len(r.kvs), r.rev, r.err)
	}
	go func() { kvs, rev, err := g.l.List(context.Background()); res <- result{kvs, rev, err} }()
	g.get(0, errors.New("unavailable"))
	if r := <-res; r.err == nil || r.err.Error() != "while listing /p/ in etcd: unavailable" {
		t.Fatalf("List error = %v", r.err)
	}
}
