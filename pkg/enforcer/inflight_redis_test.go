package enforcer

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/fallback"
	"github.com/allot-dev/allot/pkg/lease"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/allot-dev/allot/pkg/testenv"
)

// In-flight limits through the production stack (fallback → lease → Redis Cluster), the
// script's time injected: N concurrent holders admitted, the N+1st refused; a release
// frees a slot once; a holder that never releases frees its slot at the timeout.
func TestInflightRedisCluster(t *testing.T) {
	ctx := context.Background()
	cl := testenv.RedisCluster(t, testenv.ClusterOptions{Masters: 3})
	clk := clock.NewFake(t0)
	rs, err := bucket.NewRedis(cl.Client(), bucket.RedisOptions{KeyPrefix: "inflight-test:", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rs.Close() })
	lc := lease.DefaultConfig()
	lc.Clock = clk
	ls, err := lease.New(rs, lc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ls.Close() })
	fc := fallback.DefaultConfig()
	fc.Clock = clk
	fs, err := fallback.New(ls, fc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fs.Close() })
	r := newRig(t, `
rules:
  - id: exports
    limits:
      - {name: second, rate: 1000, per: 1s}
      - {name: inflight, concurrent: 4, timeout: 30s}
`, func(clock.Clock) bucket.Store { return fs }, func(c *Config) { c.Clock = clk })
	a := rules.Attrs{APIKey: "k"}

	var mu sync.Mutex
	var handles []string
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := r.e.Check(ctx, &Request{Attrs: a})
			if err != nil || !d.Allowed || d.Handle == "" || d.Limit != "exports/second" {
				t.Errorf("concurrent holder: %+v %v, want allowed with a handle, the rate stating the budget", d, err)
				return
			}
			mu.Lock()
			handles = append(handles, d.Handle)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if n, err := cl.Client().ZCard(ctx, rs.HeldKey("key:k", "exports/inflight")).Result(); err != nil || n != 4 {
		t.Fatalf("Redis holds %d slots (%v), want 4", n, err)
	}
	d, err := r.e.Check(ctx, &Request{Attrs: a})
	if err != nil || d.Allowed || d.Limit != "exports/inflight" || d.Source != SourceRedis || d.RetryAfter != 30*time.Second {
		t.Fatalf("5th holder: %+v %v, want refused by redis, retry after 30s", d, err)
	}
	if err := r.e.Release(ctx, handles[0]); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := r.e.Release(ctx, handles[0]); !errors.Is(err, ErrUnknownHandle) {
		t.Fatalf("second Release: %v, want ErrUnknownHandle", err)
	}
	if err := r.e.Release(ctx, encodeHandle(newSlotID(), []heldSlot{{name: "exports/inflight", identity: "key:k"}})); !errors.Is(err, ErrUnknownHandle) {
		t.Fatalf("Release of an unknown handle: %v, want ErrUnknownHandle", err)
	}
	clk.Advance(10 * time.Second)
	if d := r.check(t, a); !d.Allowed {
		t.Fatalf("after a release: %+v, want allowed", d)
	}
	if d := r.check(t, a); d.Allowed || d.RetryAfter != 20*time.Second {
		t.Fatalf("full again: %+v, want refused until the first holders time out (20s)", d)
	}
	// Nobody releases: the three left from the first round time out together.
	clk.Advance(20 * time.Second)
	for i := range 3 {
		if d := r.check(t, a); !d.Allowed {
			t.Fatalf("after the timeout, holder %d: %+v, want allowed", i, d)
		}
	}
	if d := r.check(t, a); d.Allowed {
		t.Fatalf("cap reached again: %+v, want refused", d)
	}
}
