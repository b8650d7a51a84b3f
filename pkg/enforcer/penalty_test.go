package enforcer

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/rules"
)

const penaltyRules = `
rules:
  - id: login
    limits: [{name: second, rate: 1, per: 1s, burst: 2}]
    penalty: {refusals: 5, within: 1m, block: 10m}
`

// A key refused 5 times within a minute is refused for 10 minutes: the refusal names the
// rule and says it is a penalty, Retry-After runs to the block's end, explain shows it,
// and after the block the key is admitted again.
func TestPenaltyDecisionAndExplain(t *testing.T) {
	r := newRig(t, penaltyRules, nil)
	a := rules.Attrs{APIKey: "k"}
	for range 2 {
		if d := r.check(t, a); !d.Allowed {
			t.Fatalf("within the burst: %+v", d)
		}
	}
	for i := range 4 {
		if d := r.check(t, a); d.Allowed || d.Penalized {
			t.Fatalf("refusal %d: %+v, want refused by the rate, not yet penalized", i+1, d)
		}
	}
	d := r.check(t, a)
	if d.Allowed || !d.Penalized || d.Rule != "login" || d.RetryAfter != 10*time.Minute || d.RetryAfterSeconds() != 600 {
		t.Fatalf("fifth refusal: %+v, want penalized by login for 10m", d)
	}
	r.clk.Advance(5 * time.Minute) // the bucket is full again; the penalty holds
	if d := r.check(t, a); d.Allowed || !d.Penalized || d.RetryAfter != 5*time.Minute {
		t.Fatalf("5 minutes in: %+v, want penalized 5m more", d)
	}
	if d, err := r.e.Check(context.Background(), &Request{Attrs: a, Peek: true}); err != nil || d.Allowed || !d.Penalized {
		t.Fatalf("a peek (hits_addend 0) while blocked: %+v %v, want refused as penalized", d, err)
	}
	x, err := r.e.Explain(context.Background(), &Request{Attrs: a}, true)
	if err != nil {
		t.Fatal(err)
	}
	p := x.Rules[0].Penalty
	if p == nil || !p.Blocked || p.Counted != 5 || !p.Until.Equal(t0.Add(10*time.Minute)) || p.Refusals != 5 || p.BlockSeconds != 600 {
		t.Fatalf("explain: %+v, want blocked until %v with 5 counted", p, t0.Add(10*time.Minute))
	}
	r.clk.Advance(5 * time.Minute)
	if d := r.check(t, a); !d.Allowed {
		t.Fatalf("after the block: %+v, want allowed", d)
	}
	x, _ = r.e.Explain(context.Background(), &Request{Attrs: a}, true)
	if p := x.Rules[0].Penalty; p == nil || p.Blocked {
		t.Fatalf("explain after the block: %+v, want not blocked", p)
	}
	// A rule without a penalty shows none.
	r2 := newRig(t, "rules:\n  - id: plain\n    limits: [{name: s, rate: 1, per: 1s}]\n", nil)
	x, _ = r2.e.Explain(context.Background(), &Request{Attrs: a}, true)
	if x.Rules[0].Penalty != nil {
		t.Fatalf("explain of a rule without a penalty: %+v", x.Rules[0].Penalty)
	}
}
