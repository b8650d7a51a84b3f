package overrides

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/allot-dev/allot/pkg/testenv/poll"
	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The tests below run against real etcd (pkg/testenv) and skip under -short.

type wrig struct {
	cli    *clientv3.Client
	prefix string
	fc     *clock.Fake
	h      *Holder
	w      *Watcher
}

func newWrig(t *testing.T, cli *clientv3.Client, name string) *wrig {
	t.Helper()
	r := &wrig{cli: cli, prefix: "/test/" + name + "/shares/", fc: clock.NewFake(time.Now().UTC().Truncate(time.Second))}
	r.h = newHolder(t, r.fc, nil)
	cfg := DefaultWatcherConfig()
	cfg.Prefix, cfg.Clock = r.prefix, r.fc
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: name, Level: hclog.Debug, Output: testWriter{t}})
	w, err := NewWatcher(cli, r.h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.w = w
	t.Cleanup(func() { _ = w.Close() })
	return r
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

// put writes one key and returns the revision of the write.
func (r *wrig) put(t *testing.T, key string, v []byte) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := r.cli.Put(ctx, key, string(v))
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// caughtUp polls (bounded) until the watcher has seen etcd revision rev: everything
// written up to it has been offered to the Holder.
func (r *wrig) caughtUp(t *testing.T, rev int64) {
	t.Helper()
	poll.Until(t, 10*time.Second, fmt.Sprintf("watcher at revision %d", rev), func() error {
		if got := r.w.Revision(); got < rev {
			return fmt.Errorf("at revision %d", got)
		}
		return nil
	})
}

// putChunks writes entries as chunks of at most maxBytes (the balancer's first step) and
// returns how many.
func (r *wrig) putChunks(t *testing.T, entries []contract.Entry, rev int64, ver uint64, maxBytes int) int {
	t.Helper()
	cs := contract.Split(entries, rev, ver, maxBytes)
	for i, c := range cs {
		r.put(t, contract.ChunkKey(r.prefix, i), c)
	}
	return len(cs)
}

// putHead writes the head and returns the revision of the write.
func (r *wrig) putHead(t *testing.T, rev int64, ver uint64, chunks, entries int) int64 {
	t.Helper()
	hd := head(rev, ver, r.fc.Now())
	hd.Chunks, hd.Entries = chunks, entries
	b, err := json.Marshal(hd)
	if err != nil {
		t.Fatal(err)
	}
	return r.put(t, contract.HeadKey(r.prefix), b)
}

// publish writes a whole set, chunks then head, and returns when the head was written.
func (r *wrig) publish(t *testing.T, entries []contract.Entry, rev int64, ver uint64) time.Time {
	t.Helper()
	n := r.putChunks(t, entries, rev, ver, 300) // about one entry a chunk: many chunks
	r.putHead(t, rev, ver, n, len(entries))
	return time.Now()
}

// waitApplied polls (bounded) until the Holder applies (rev, ver); it returns how long.
func (r *wrig) waitApplied(t *testing.T, rev int64, ver uint64, since time.Time) time.Duration {
	t.Helper()
	poll.Until(t, 10*time.Second, fmt.Sprintf("set %d/%d applied", rev, ver), func() error {
		if gr, gv := r.h.Applied(); gr != rev || gv != ver {
			return fmt.Errorf("the holder has %d/%d", gr, gv)
		}
		return nil
	})
	return time.Since(since)
}

func entries(n int, us float64) []contract.Entry {
	es := make([]contract.Entry, n)
	for i := range es {
		es[i] = entry(fmt.Sprintf("key:k%d", i), us, (1-us)/2, (1-us)/2)
	}
	return es
}

func TestWatcher(t *testing.T) {
	cluster := testenv.Etcd(t, 1)
	cli := cluster.Client(t)
	rule := compiled(t)

	t.Run("an empty prefix is loaded: nothing published means the default split", func(t *testing.T) {
		r := newWrig(t, cli, "empty")
		r.h.cfg.WaitForSet = true
		r.h.loaded.Store(false)
		if s := r.h.Share(rule, "key:a", r.fc.Now()); !near(s, DefaultFloor) {
			t.Fatalf("before the list: share %g, want the floor", s)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.w.Load(ctx); err != nil {
			t.Fatal(err)
		}
		if s := r.h.Share(rule, "key:a", r.fc.Now()); !r.h.Loaded() || !near(s, 1.0/3) {
			t.Fatalf("after listing an empty prefix: loaded %v share %g, want the default 1/3", r.h.Loaded(), s)
		}
	})

	t.Run("applies a chunked set within a second of the head", func(t *testing.T) {
		r := newWrig(t, cli, "chunked")
		if err := r.w.Start(); err != nil {
			t.Fatal(err)
		}
		es := entries(20, 0.8)
		at := r.publish(t, es, 5, 1)
		took := r.waitApplied(t, 5, 1, at)
		t.Logf("applied %d entries in %d chunks %v after the head write", len(es), len(contract.Split(es, 5, 1, 300)), took)
		if took > time.Second {
			t.Errorf("applied %v after the head write, want within ~1s", took)
		}
		if s := r.h.Share(rule, "key:k19", r.fc.Now()); !near(s, 0.8) {
			t.Fatalf("share %g, want 0.8", s)
		}
		// The next version replaces it.
		at = r.publish(t, entries(5, 0.6), 5, 2)
		r.waitApplied(t, 5, 2, at)
		if s := r.h.Share(rule, "key:k19", r.fc.Now()); !near(s, 1.0/3) {
			t.Fatalf("an identity the new set drops: share %g, want the default", s)
		}
		if r.h.Len() != 5 {
			t.Fatalf("len %d, want 5", r.h.Len())
		}
	})

	t.Run("ignores an older leader's set", func(t *testing.T) {
		r := newWrig(t, cli, "fenced")
		if err := r.w.Start(); err != nil {
			t.Fatal(err)
		}
		r.waitApplied(t, 7, 3, r.publish(t, entries(4, 0.7), 7, 3))
		// A deposed leader's set (its fenced Txn would fail at etcd; written here anyway).
		n := r.putChunks(t, entries(4, 0.1), 6, 99, 300)
		r.caughtUp(t, r.putHead(t, 6, 99, n, 4))
		if rev, ver := r.h.Applied(); rev != 7 || ver != 3 {
			t.Fatalf("applied %d/%d from an older leader", rev, ver)
		}
		if s := r.h.Share(rule, "key:k0", r.fc.Now()); !near(s, 0.7) {
			t.Fatalf("share %g, want leader 7's 0.7", s)
		}
		r.waitApplied(t, 8, 1, r.publish(t, entries(4, 0.5), 8, 1))
		if s := r.h.Share(rule, "key:k0", r.fc.Now()); !near(s, 0.5) {
			t.Fatalf("share %g, want the newer leader's 0.5", s)
		}
	})

	t.Run("a head whose chunks do not match waits", func(t *testing.T) {
		r := newWrig(t, cli, "mismatch")
		if err := r.w.Start(); err != nil {
			t.Fatal(err)
		}
		es := entries(12, 0.9)
		r.waitApplied(t, 2, 1, r.publish(t, es, 2, 1))
		// Version 2: only chunk 0 rewritten, then the head (a publication cut short).
		cs := contract.Split(entries(12, 0.4), 2, 2, 300)
		r.put(t, contract.ChunkKey(r.prefix, 0), cs[0])
		r.caughtUp(t, r.putHead(t, 2, 2, len(cs), 12))
		if _, v := r.h.Applied(); v != 1 {
			t.Fatalf("applied version %d from a head whose chunks are version 1", v)
		}
		if s := r.h.Share(rule, "key:k11", r.fc.Now()); !near(s, 0.9) {
			t.Fatalf("share %g, want version 1's 0.9", s)
		}
		// The missing chunks arrive: now it is whole.
		for i := 1; i < len(cs); i++ {
			r.put(t, contract.ChunkKey(r.prefix, i), cs[i])
		}
		r.waitApplied(t, 2, 2, time.Now())
		if s := r.h.Share(rule, "key:k11", r.fc.Now()); !near(s, 0.4) {
			t.Fatalf("share %g, want version 2's 0.4", s)
		}
		// A head whose entry count disagrees with its chunks is refused.
		n := r.putChunks(t, entries(6, 0.2), 2, 3, 300)
		r.caughtUp(t, r.putHead(t, 2, 3, n, 7))
		if _, v := r.h.Applied(); v != 2 {
			t.Fatalf("applied version %d whose head counts 7 entries in chunks of 6", v)
		}
	})

	t.Run("a version that rewrote only its changed chunks", func(t *testing.T) {
		r := newWrig(t, cli, "changed")
		if err := r.w.Start(); err != nil {
			t.Fatal(err)
		}
		c := contract.NewChunker(600) // a few entries a chunk: many chunks
		pub := func(es []contract.Entry, ver uint64) (writes int) {
			ws, vs := c.Next(es, 4, ver)
			for _, w := range ws {
				r.put(t, contract.ChunkKey(r.prefix, w.Index), w.Data)
			}
			hd := head(4, ver, r.fc.Now())
			hd.Chunks, hd.Entries, hd.ChunkVersions = len(vs), len(es), vs
			b, err := json.Marshal(hd)
			if err != nil {
				t.Fatal(err)
			}
			r.put(t, contract.HeadKey(r.prefix), b)
			return len(ws)
		}
		es := entries(40, 0.5)
		all := pub(es, 1)
		r.waitApplied(t, 4, 1, time.Now())
		es[7] = entry("key:k7", 0.9, 0.05, 0.05)
		if n := pub(es, 2); n != 1 || all < 8 {
			t.Fatalf("one entry changed: %d chunks written (of %d), want 1", n, all)
		}
		r.waitApplied(t, 4, 2, time.Now())
		if s := r.h.Share(rule, "key:k7", r.fc.Now()); !near(s, 0.9) {
			t.Fatalf("the changed entry: share %g, want 0.9", s)
		}
		if s := r.h.Share(rule, "key:k30", r.fc.Now()); !near(s, 0.5) || r.h.Len() != 40 {
			t.Fatalf("an unchanged entry: share %g (len %d), want 0.5 of 40 entries", s, r.h.Len())
		}
	})

	t.Run("lists again after compaction", func(t *testing.T) {
		r := newWrig(t, cli, "compacted")
		ctx := context.Background()
		r.publish(t, entries(3, 0.5), 1, 1)
		if err := r.w.Load(ctx); err != nil {
			t.Fatal(err)
		}
		if _, v := r.h.Applied(); v != 1 {
			t.Fatalf("Load applied version %d, want 1", v)
		}
		r.publish(t, entries(3, 0.3), 1, 2)
		resp, err := cli.Get(ctx, r.prefix+"head")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Compact(ctx, resp.Header.Revision); err != nil {
			t.Fatal(err)
		}
		// The watch would start at the revision after Load's: compacted away.
		if err := r.w.Start(); err != nil {
			t.Fatal(err)
		}
		r.waitApplied(t, 1, 2, time.Now())
	})

	t.Run("etcd down keeps the last shares, then they go stale", func(t *testing.T) {
		r := newWrig(t, cli, "outage")
		if err := r.w.Start(); err != nil {
			t.Fatal(err)
		}
		r.waitApplied(t, 3, 1, r.publish(t, []contract.Entry{entry("key:up", 0.9, 0.05, 0.05), entry("key:down", 0.1, 0.45, 0.45)}, 3, 1))
		cluster.Members[0].Stop(t)
		defer cluster.Members[0].Start(t)
		r.fc.Advance(time.Minute) // retries fail meanwhile
		if s := r.h.Share(rule, "key:up", r.fc.Now()); !near(s, 0.9) {
			t.Fatalf("etcd down: share %g, want the last 0.9", s)
		}
		r.fc.Advance(DefaultStale)
		if s := r.h.Share(rule, "key:up", r.fc.Now()); !near(s, 1.0/3) {
			t.Fatalf("stale: share %g, want min(0.9, 1/3)", s)
		}
		if s := r.h.Share(rule, "key:down", r.fc.Now()); !near(s, 0.1) {
			t.Fatalf("stale: share %g, want min(0.1, 1/3)", s)
		}
		if rev, ver := r.h.Applied(); rev != 3 || ver != 1 {
			t.Fatalf("applied %d/%d, want the last 3/1", rev, ver)
		}
	})
}

func TestWatcherConfig(t *testing.T) {
	for _, tc := range []struct {
		mod  func(*WatcherConfig)
		want string
	}{
		{func(c *WatcherConfig) { c.Prefix = "" }, "prefix is empty"},
		{func(c *WatcherConfig) { c.Timeout = 0 }, "timeout 0s, must be > 0"},
		{func(c *WatcherConfig) { c.BackoffMax = time.Millisecond }, "backoff 100ms..1ms"},
	} {
		cfg := DefaultWatcherConfig()
		tc.mod(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want %q", err, tc.want)
		}
	}
}
