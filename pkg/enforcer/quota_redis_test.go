package enforcer

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/quota"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/prometheus/client_golang/prometheus"
)

// quotaNode is one enforcer of a region: its own quota table over the shared counters.
type quotaNode struct {
	e  *Enforcer
	tb *quota.Table
}

// nowish is a fake clock's start for tests against a real Redis: the counters expire a
// day after their period in the server's real time, so the period must be today's.
func nowish() time.Time { return time.Now().UTC().Truncate(time.Hour) }

func newQuotaNode(t *testing.T, h *rules.Holder, store bucket.Store, counters quota.Counter, clk clock.Clock) *quotaNode {
	t.Helper()
	qc := quota.DefaultConfig()
	qc.Clock = clk
	tb, err := quota.New(counters, qc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tb.Close() })
	cfg := DefaultConfig()
	cfg.Region, cfg.Rules, cfg.Store, cfg.Clock, cfg.Registerer, cfg.Quotas = "us-east", h, store, clk, prometheus.NewRegistry(), tb
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &quotaNode{e: e, tb: tb}
}

// Calendar quotas on a real Redis Cluster: several enforcers sharing one quota admit at
// most the quota + the stated bound, refusals are not counted, the counter is the
// admitted count, and raising the quota mid-period admits at once.
func TestQuotaRedisCluster(t *testing.T) {
	ctx := context.Background()
	cl := testenv.RedisCluster(t, testenv.ClusterOptions{Masters: 3})
	clk := clock.NewFake(nowish())
	rs, err := bucket.NewRedis(cl.Client(), bucket.RedisOptions{KeyPrefix: "quota-test:"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rs.Close() })
	const yaml = `
rules:
  - id: api
    limits:
      - {name: second, rate: 100000, per: 1s}
      - {name: daily, quota: 300, period: day}
`
	h := rules.NewHolder(compile(t, yaml, t0))
	mem := bucket.NewMemory(clk, 0) // the rate is not what is tested
	const n = 3
	nodes := make([]*quotaNode, n)
	for i := range nodes {
		nodes[i] = newQuotaNode(t, h, mem, rs, clk)
	}
	a := rules.Attrs{APIKey: "shared"}
	start, end := rules.PeriodBounds(clk.Now(), rules.PeriodDay, time.UTC)
	key := rs.CounterKey("key:shared", "api/daily", start)
	if !strings.Contains(key, "{key:shared}#q:api/daily:") || testenv.Slot(key) != testenv.Slot(rs.Key("key:shared", "api/second")) {
		t.Fatalf("counter key %q is not in the identity's slot", key)
	}

	// Each enforcer takes 8 requests a flush interval, concurrently: 24 a batch in all.
	const perFlush = 8
	admitted, refused := 0, 0
	var mu sync.Mutex
	for round := 0; round < 30; round++ {
		var wg sync.WaitGroup
		for _, nd := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range perFlush {
					d, err := nd.e.Check(ctx, &Request{Attrs: a})
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					if d.Allowed {
						admitted++
					} else {
						refused++
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		clk.Advance(2 * time.Second)
		for _, nd := range nodes {
			nd.tb.Flush(ctx)
		}
	}
	for _, nd := range nodes {
		nd.tb.Flush(ctx) // every enforcer has sent everything
	}
	bound := n * perFlush * 2 // enforcers × (rate × flush), for the batch and the refresh's lag
	if admitted < 300 || admitted > 300+bound || refused == 0 {
		t.Fatalf("admitted %d, refused %d; want admitted in [300, %d]", admitted, refused, 300+bound)
	}
	got, err := cl.Client().Get(ctx, key).Int64()
	if err != nil || got != int64(admitted) {
		t.Fatalf("counter %d (%v), want the %d admitted: refusals not counted", got, err, admitted)
	}
	ttl, err := cl.Client().PTTL(ctx, key).Result()
	if want := end.Add(24 * time.Hour).Sub(time.Now()); err != nil || ttl <= 0 || ttl > want+time.Second {
		t.Fatalf("counter TTL %v (%v), want it to expire a day after the period (at most %v)", ttl, err, want)
	}
	t.Logf("%d enforcers, %d requests a batch, quota 300: admitted %d (bound %d), refused %d", n, n*perFlush, admitted, 300+bound, refused)

	// Raised mid-period: admits at once on every enforcer, up to the new quota.
	h.Store(compile(t, strings.Replace(yaml, "quota: 300", "quota: 400", 1), t0))
	more := 0
	for range 150 {
		for _, nd := range nodes {
			if d, _ := nd.e.Check(ctx, &Request{Attrs: a}); d.Allowed {
				more++
			}
		}
		if more > 0 && more%20 == 0 {
			clk.Advance(2 * time.Second)
			for _, nd := range nodes {
				nd.tb.Flush(ctx)
			}
		}
	}
	if more == 0 || admitted+more > 400+bound {
		t.Fatalf("after raising to 400: %d more admitted (%d in all), want some, at most %d in all", more, admitted+more, 400+bound)
	}
}

// A Redis restart in the middle of a period, against a real cluster: without
// persistence the counter comes back empty and the enforcers' next batches raise it to
// the last total they knew (max, never the sum); with the append-only file (what the
// chart ships) the counter survives the restart by itself.
func TestQuotaRedisRestart(t *testing.T) {
	for _, persist := range []bool{false, true} {
		name := "no persistence"
		if persist {
			name = "appendonly"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			cl := testenv.RedisCluster(t, testenv.ClusterOptions{Masters: 3, Persist: persist})
			clk := clock.NewFake(nowish())
			client := cl.Client()
			rs, err := bucket.NewRedis(client, bucket.RedisOptions{KeyPrefix: "quota-restart:"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = rs.Close() })
			h := rules.NewHolder(compile(t, `
rules:
  - id: api
    limits: [{name: monthly, quota: 1000, period: month}]
`, t0))
			mem := bucket.NewMemory(clk, 0)
			a, b := newQuotaNode(t, h, mem, rs, clk), newQuotaNode(t, h, mem, rs, clk)
			attrs := rules.Attrs{APIKey: "k"}
			for range 60 {
				if d, err := a.e.Check(ctx, &Request{Attrs: attrs}); err != nil || !d.Allowed {
					t.Fatalf("%+v, %v", d, err)
				}
			}
			for range 40 {
				if d, err := b.e.Check(ctx, &Request{Attrs: attrs}); err != nil || !d.Allowed {
					t.Fatalf("%+v, %v", d, err)
				}
			}
			a.tb.Flush(ctx)
			b.tb.Flush(ctx)
			a.tb.Flush(ctx) // both know 100
			start, _ := rules.PeriodBounds(clk.Now(), rules.PeriodMonth, time.UTC)
			key := rs.CounterKey("key:k", "api/monthly", start)
			if got, err := client.Get(ctx, key).Int64(); err != nil || got != 100 {
				t.Fatalf("counter %d (%v) before the restart, want 100", got, err)
			}

			master := cl.MasterFor(key)
			master.Stop(t)
			// Counted during the outage: kept pending, flushed when the shard is back.
			for range 5 {
				if d, err := b.e.Check(ctx, &Request{Attrs: attrs}); err != nil || !d.Allowed {
					t.Fatalf("%+v, %v", d, err)
				}
			}
			b.tb.Flush(ctx) // fails: the shard is down
			master.Start(t)
			cl.WaitOK(t)
			if persist {
				if got, err := client.Get(ctx, key).Int64(); err != nil || got != 100 {
					t.Fatalf("counter %d (%v) after a restart with appendonly, want 100 kept", got, err)
				}
			} else if got, _ := client.Get(ctx, key).Int64(); got != 0 {
				t.Fatalf("counter %d after a restart without persistence, want it lost (0)", got)
			}
			// The next batches restore it (bounded: the client reconnects).
			deadline := time.Now().Add(30 * time.Second)
			for {
				clk.Advance(2 * time.Second)
				a.tb.Flush(ctx)
				b.tb.Flush(ctx)
				got, _ := client.Get(ctx, key).Int64()
				if got == 105 {
					break
				}
				if got > 105 {
					t.Fatalf("counter %d after the restart, more than the 105 counted: a count added twice", got)
				}
				if time.Now().After(deadline) {
					t.Fatalf("counter %d 30 s after the restart, want 105 (100 known + 5 counted meanwhile)", got)
				}
				time.Sleep(100 * time.Millisecond) // a real server reconnecting: bounded poll
			}
			a.tb.Flush(ctx) // a learns b's counts
			x, err := a.e.Explain(ctx, &Request{Attrs: attrs}, true)
			if err != nil || len(x.Rules) != 1 || len(x.Rules[0].Quotas) != 1 || x.Rules[0].Quotas[0].Used != 105 || x.Rules[0].Quotas[0].Remaining != 895 {
				t.Fatalf("explain after the restart: %+v, %v", x, err)
			}
		})
	}
}
