package enforcer_test

import (
	"context"
	"fmt"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/enforcer"
	"github.com/allot-dev/allot/pkg/rules"
	"github.com/prometheus/client_golang/prometheus"
)

// A check through the enforcer: rules compiled for one region, an exact in-memory store
// (in production fallback → lease → redis), a fake clock. The pro plan's rule allows 2 a
// second with bursts of 2 per API key: key k1's third check at one instant is refused by
// that rule, with the time until it could pass, while another key has a budget of its
// own; a second later k1 passes again.
func ExampleEnforcer_Check() {
	set, err := rules.ParseYAML([]byte(`
rules:
  - id: default
    limits: [{name: second, rate: 10, per: 1s}]
  - id: pro
    match: {plan: pro}
    limits: [{name: second, rate: 2, per: 1s, burst: 2}]
`))
	if err != nil {
		panic(err)
	}
	clk := clock.NewFake(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	snap, err := rules.Compile(set, rules.CompileOptions{Region: "us-east", Now: clk.Now()})
	if err != nil {
		panic(err)
	}
	cfg := enforcer.DefaultConfig()
	cfg.Region = "us-east"
	cfg.Rules = rules.NewHolder(snap)
	cfg.Store = bucket.NewMemory(clk, 0)
	cfg.Clock = clk
	cfg.Registerer = prometheus.NewRegistry()
	cfg.ResetJitterMax = 0 // exact reset times in the output
	e, err := enforcer.New(cfg)
	if err != nil {
		panic(err)
	}

	check := func(key string) {
		d, err := e.Check(context.Background(), &enforcer.Request{Attrs: rules.Attrs{APIKey: key, Plan: "pro"}})
		if err != nil {
			panic(err)
		}
		if d.Allowed {
			fmt.Printf("%s: allowed by %s (%s), %d left\n", key, d.Rule, d.Source, d.Remaining)
		} else {
			fmt.Printf("%s: refused by %s, retry after %v\n", key, d.Limit, d.RetryAfter)
		}
	}
	check("k1")
	check("k1")
	check("k1")
	check("k2")
	clk.Advance(time.Second)
	check("k1")
	// Output:
	// k1: allowed by pro (memory), 1 left
	// k1: allowed by pro (memory), 0 left
	// k1: refused by pro/second, retry after 500ms
	// k2: allowed by pro (memory), 1 left
	// k1: allowed by pro (memory), 1 left
}
