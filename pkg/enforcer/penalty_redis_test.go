package enforcer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/fallback"
	"github.com/allot-dev/allot/pkg/lease"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/allot-dev/allot/pkg/testenv/poll"
)

// A penalty through the production stack (fallback → lease → Redis Cluster) on three
// enforcers sharing the cluster: a key refused on all three, mostly from their refusal
// caches, is counted across them and blocked; every enforcer then refuses it for the
// block without a Redis call, naming the rule, explain shows it, and after the block it
// is admitted again. The take script keeps the server's time, so the block is short (2 s)
// and waited out by a bounded poll.
func TestPenaltyRedisCluster(t *testing.T) {
	ctx := context.Background()
	cl := testenv.RedisCluster(t, testenv.ClusterOptions{Masters: 3})
	const yaml = `
rules:
  - id: abuse
    limits: [{name: second, rate: 5, per: 1s, burst: 5}]
    penalty: {refusals: 150, within: 10s, block: 2s}
`
	type enf struct {
		r  *rig
		rs *bucket.Redis
	}
	var es []enf
	for range 3 {
		rs, err := bucket.NewRedis(cl.Client(), bucket.RedisOptions{KeyPrefix: "penalty-test:"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = rs.Close() })
		lc := lease.DefaultConfig()
		lc.Peers = func() int { return 3 }
		ls, err := lease.New(rs, lc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ls.Close() })
		fs, err := fallback.New(ls, fallback.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = fs.Close() })
		r := newRig(t, yaml, func(clock.Clock) bucket.Store { return fs }, func(c *Config) { c.Clock, c.Peek = clock.Real(), rs })
		es = append(es, enf{r, rs})
	}
	calls := func() (n uint64) {
		for _, e := range es {
			n += e.rs.Calls()
		}
		return n
	}
	a := rules.Attrs{APIKey: "abuser"}
	check := func(e enf) Decision {
		t.Helper()
		d, err := e.r.e.Check(ctx, &Request{Attrs: a})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}

	// Round-robin over the three until one answers penalized (bounded: 5,000 checks).
	refused, penalizedOn := 0, -1
	for i := 0; i < 5000 && penalizedOn < 0; i++ {
		d := check(es[i%3])
		switch {
		case d.Penalized:
			penalizedOn = i % 3
			if d.Rule != "abuse" || d.RetryAfter <= 0 || d.RetryAfter > 2*time.Second {
				t.Fatalf("penalized answer %+v: want rule abuse, retry-after within the 2 s block", d)
			}
		case !d.Allowed:
			refused++
		}
		if i%30 == 29 {
			time.Sleep(5 * time.Millisecond) // let refusal caches run out now and then
		}
	}
	if penalizedOn < 0 {
		t.Fatalf("never penalized after %d refusals over three enforcers", refused)
	}
	blockedAt := time.Now()
	// Each enforcer learns of the block at its next call (when its refusal cache runs
	// out: at most 1/rate here); then none calls Redis for the rest of the block.
	poll.Until(t, time.Second, "every enforcer answering penalized", func() error {
		learned := 0
		for _, e := range es {
			if check(e).Penalized {
				learned++
			}
		}
		if learned < 3 {
			return fmt.Errorf("only %d of 3 enforcers answered penalized", learned)
		}
		return nil
	})
	x, err := es[0].r.e.Explain(ctx, &Request{Attrs: a}, true)
	if err != nil {
		t.Fatal(err)
	}
	if p := x.Rules[0].Penalty; p == nil || !p.Blocked || p.Counted < 150 || p.Until.Before(blockedAt) || p.Error != "" {
		t.Fatalf("explain during the block: %+v", p)
	}
	before := calls()
	var during int
	for time.Since(blockedAt) < 1200*time.Millisecond {
		for _, e := range es {
			if d := check(e); !d.Penalized || d.Source != SourceRefusalCache || d.Rule != "abuse" {
				t.Fatalf("during the block: %+v, want penalized from the refusal cache", d)
			}
			during++
		}
	}
	if n := calls() - before; n != 0 {
		t.Fatalf("%d Redis calls for %d checks during the block, want none", n, during)
	}
	// After the block (2 s, + a bounded wait): admitted again on every enforcer.
	for i := range es {
		poll.Until(t, time.Until(blockedAt.Add(4*time.Second)), fmt.Sprintf("enforcer %d admitting again after a 2 s block", i), func() error {
			if d := check(es[i]); !d.Allowed {
				return fmt.Errorf("refused: %+v", d)
			}
			return nil
		})
	}
	t.Logf("blocked after %d refusals seen on 3 enforcers (threshold 150); %d checks during the block, 0 Redis calls", refused, during)
}
