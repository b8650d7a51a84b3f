package etcdwatch

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/testenv"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The test below runs against real etcd (pkg/testenv) and skips under -short: what the
// fake cannot show is that etcd's client and server agree with the loop on revisions,
// prefixes and compaction.

// recorder is a Handler that sends each call, as a line, to c.
type recorder struct{ c chan string }

func (r recorder) handler() Handler {
	send := func(ctx context.Context, s string) {
		select {
		case r.c <- s:
		case <-ctx.Done():
		}
	}
	return Handler{
		OnList: func(ctx context.Context, kvs []*mvccpb.KeyValue, rev int64) {
			var b strings.Builder
			for _, kv := range kvs {
				fmt.Fprintf(&b, " %s=%s", kv.Key, kv.Value)
			}
			send(ctx, "list"+b.String())
		},
		OnEvents: func(ctx context.Context, evs []*clientv3.Event, rev int64) {
			for _, ev := range evs {
				send(ctx, fmt.Sprintf("%s %s=%s", ev.Type, ev.Kv.Key, ev.Kv.Value))
			}
		},
		OnError: func(ctx context.Context, f Failure) {
			send(ctx, fmt.Sprintf("error compacted=%v: %v", f.Compacted, f.Err))
		},
	}
}

func (r recorder) expect(t *testing.T, want string) {
	t.Helper()
	select {
	case got := <-r.c:
		if !strings.HasPrefix(got, want) {
			t.Fatalf("handler got %q, want %q", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no handler call within 10s; want %q", want)
	}
}

func TestLoopAgainstEtcd(t *testing.T) {
	cli := testenv.Etcd(t, 1).Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	put := func(k, v string) int64 {
		t.Helper()
		resp, err := cli.Put(ctx, k, v)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	cfg := Config{Prefix: "/w/", Timeout: 5 * time.Second, Clock: clock.Real(),
		Backoff: Backoff{Min: 50 * time.Millisecond, Max: time.Second}}
	// start runs a new Loop; with list, Run starts after an owner's List (whose revision
	// it returns).
	start := func(list func(l *Loop)) (recorder, *Loop, func()) {
		rec := recorder{c: make(chan string, 16)}
		l, err := New(cli, cfg, rec.handler())
		if err != nil {
			t.Fatal(err)
		}
		if list != nil {
			list(l)
		}
		rctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); l.Run(rctx) }()
		return rec, l, func() { stop(); <-done }
	}

	put("/w/a", "1")
	put("/w/b", "1")
	put("/other", "x") // outside the prefix: never seen
	rec, l, stop := start(nil)
	rec.expect(t, "list /w/a=1 /w/b=1")
	put("/w/c", "1")
	put("/other", "y")
	if _, err := cli.Delete(ctx, "/w/a"); err != nil {
		t.Fatal(err)
	}
	rec.expect(t, "PUT /w/c=1")
	rec.expect(t, "DELETE /w/a=")

	// List reads the prefix as Run's own list does.
	kvs, rev, err := l.List(ctx)
	if err != nil || len(kvs) != 2 || string(kvs[0].Key) != "/w/b" || string(kvs[1].Key) != "/w/c" {
		t.Fatalf("List = %d keys at %d, %v", len(kvs), rev, err)
	}
	stop()

	// After an owner's List, Run sees the changes after its revision, and only those.
	var listedAt func() // makes a change after the List, before Run
	listThenChange := func(l *Loop) {
		if _, _, err := l.List(ctx); err != nil {
			t.Fatal(err)
		}
		listedAt()
	}
	listedAt = func() { put("/w/d", "1") }
	rec, _, stop = start(listThenChange)
	rec.expect(t, "PUT /w/d=1")
	stop()

	// One whose revision has been compacted away meanwhile lists again at once.
	listedAt = func() {
		put("/w/b", "2")
		last := put("/w/e", "1")
		if _, err := cli.Compact(ctx, last); err != nil {
			t.Fatal(err)
		}
	}
	rec, _, stop = start(listThenChange)
	defer stop()
	rec.expect(t, "error compacted=true: while watching /w/ from revision")
	rec.expect(t, "list /w/b=2 /w/c=1 /w/d=1 /w/e=1")
	put("/w/f", "1")
	rec.expect(t, "PUT /w/f=1")
}
