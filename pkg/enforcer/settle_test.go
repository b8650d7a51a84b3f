package enforcer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/rules"
)

const settleMemRules = `
rules:
  - id: llm
    match: {plan: pro}
    limits:
      - {name: minute, rate: 60, per: 1m}
  - id: org
    match: {org: small}
    by: org
    limits:
      - {name: minute, rate: 5, per: 1m}
  - id: done
    match: {domain: llm, descriptor: [{key: api_key}, {key: phase, value: done}]}
    limits:
      - {name: minute, rate: 10, per: 1m}
    settle: true
`

// A settlement window passes: the handle is refused and the estimate stands.
func TestSettleWindowExpires(t *testing.T) {
	r := newRig(t, settleMemRules, nil, func(c *Config) { c.SettleWindow = time.Minute })
	ctx := context.Background()
	a := rules.Attrs{APIKey: "k", Plan: "pro"}
	d, err := r.e.Check(ctx, &Request{Attrs: a, Hits: 10, Settle: true})
	if err != nil || d.SettleHandle == "" || d.Remaining != 50 {
		t.Fatalf("check: %+v %v", d, err)
	}
	r.clk.Advance(time.Minute)
	if _, err := r.e.Settle(ctx, d.SettleHandle, 0); !errors.Is(err, ErrUnknownSettle) {
		t.Fatalf("settlement after the window: %v, want ErrUnknownSettle", err)
	}
	// A minute refilled the 10 of the estimate: nothing else moved.
	if d := r.check(t, a); d.Remaining != 59 {
		t.Fatalf("after the refused settlement: %+v, want 59 left", d)
	}
	if _, err := r.e.Settle(ctx, d.SettleHandle, -1); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a negative cost: %v, want ErrInvalid", err)
	}
}

// A check without Settle, or refused, answers no handle; one refused by a later rule
// marks nothing either. A handle names every rule that took, each settled by its own
// cost.
func TestSettleHandles(t *testing.T) {
	r := newRig(t, settleMemRules, nil)
	ctx := context.Background()
	if d := r.check(t, rules.Attrs{APIKey: "k", Plan: "pro"}); d.SettleHandle != "" {
		t.Fatalf("a check that did not ask: handle %q", d.SettleHandle)
	}
	a := rules.Attrs{APIKey: "k2", Plan: "pro", Org: "small"}
	d, err := r.e.Check(ctx, &Request{Attrs: a, Hits: 3, Settle: true})
	if err != nil || !d.Allowed || d.SettleHandle == "" {
		t.Fatalf("check: %+v %v", d, err)
	}
	_, ts, _ := decodeSettle(d.SettleHandle)
	if len(ts) != 2 {
		t.Fatalf("handle names %+v, want the key's and the org's rules", ts)
	}
	res, err := r.e.Settle(ctx, d.SettleHandle, 5)
	if err != nil || res.Settled != 2 || res.Rule != "org" || res.Remaining != 0 {
		t.Fatalf("settle 5 of 3: %+v %v, want both settled, the org's bucket at 0", res, err)
	}
	// The org's bucket is empty: the key's rule grants, the org's refuses: no handle.
	d, err = r.e.Check(ctx, &Request{Attrs: a, Hits: 1, Settle: true})
	if err != nil || d.Allowed || d.SettleHandle != "" {
		t.Fatalf("refused check: %+v %v, want no handle", d, err)
	}
}

// A settle: true rule takes its hits whatever the bucket holds (Envoy's stream-done
// hits): never refused, into debt of at most one burst; a peek or ordinary check is
// refused until the debt refills, and negative hits give tokens back up to the burst.
func TestSettleRuleTakesAfterTheFact(t *testing.T) {
	r := newRig(t, settleMemRules, nil)
	ctx := context.Background()
	a := rules.Attrs{Domain: "llm", Entries: []rules.Entry{{Key: "api_key", Value: "k"}, {Key: "phase", Value: "done"}}}
	for i, hits := range []int64{7, 7, 100} {
		d, err := r.e.Check(ctx, &Request{Attrs: a, Hits: hits})
		if err != nil || !d.Allowed || d.Rule != "done" || d.Remaining != 0 && i > 0 {
			t.Fatalf("stream-done hits %d: %+v %v, want allowed", hits, d, err)
		}
	}
	// 10 − 7 − 7 − 100 stops at −10: 11 tokens to refill at 10 a minute before one passes.
	if d, _ := r.e.Check(ctx, &Request{Attrs: a, Peek: true}); d.Allowed || d.RetryAfter != 66*time.Second {
		t.Fatalf("peek in debt: %+v, want refused for 66s", d)
	}
	if n, err := r.e.Refund(ctx, &Request{Attrs: a, Hits: 15}); err != nil || n != 1 {
		t.Fatalf("Refund: %d %v", n, err)
	}
	if d, _ := r.e.Check(ctx, &Request{Attrs: a, Peek: true}); !d.Allowed || d.Remaining != 5 {
		t.Fatalf("after 15 back: %+v, want 5", d)
	}
	if n, err := r.e.Refund(ctx, &Request{Attrs: a, Hits: 1000}); err != nil || n != 1 {
		t.Fatalf("Refund: %d %v", n, err)
	}
	if d, _ := r.e.Check(ctx, &Request{Attrs: a, Peek: true}); d.Remaining != 10 {
		t.Fatalf("a refund of 1000: %+v, want the burst 10", d)
	}
}

// Explain shows a bucket in debt as it is: a negative level, and the check refused until
// it refills.
func TestExplainShowsDebt(t *testing.T) {
	r := newRig(t, settleMemRules, nil)
	ctx := context.Background()
	a := rules.Attrs{APIKey: "k", Plan: "pro"}
	d, err := r.e.Check(ctx, &Request{Attrs: a, Hits: 10, Settle: true})
	if err != nil || d.SettleHandle == "" {
		t.Fatalf("check: %+v %v", d, err)
	}
	if _, err := r.e.Settle(ctx, d.SettleHandle, 100); err != nil {
		t.Fatal(err)
	}
	x := explainOf(t, r, a, true)
	llm := ruleOf(t, x, "llm")
	if lv := llm.Limits[0].Level; lv == nil || *lv != -40 || llm.Limits[0].LevelError != "" {
		t.Fatalf("explain of a bucket in debt: %+v, want level -40 (60 − 10 − 90)", llm.Limits[0])
	}
	if d := r.check(t, a); d.Allowed || d.Remaining != 0 || d.RetryAfter != 41*time.Second {
		t.Fatalf("a check in debt: %+v, want refused for 41s", d)
	}
}
