package lease

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// A key refused on three enforcers, mostly from their refusal caches, is counted across
// them (each hands its cached refusals to the store at its next call), blocked once the
// count reaches the penalty's, then refused from memory for the whole block without a
// store call, its answers saying so, and admitted again after it.
func TestPenaltyCountedAcrossRefusalCaches(t *testing.T) {
	f := newFixture(t, nil)
	f.peers.Store(3)
	es := []*Store{f.s, f.store(f.next, nil, hooks{}), f.store(f.next, nil, hooks{})}
	p := &bucket.Penalty{Name: "abuse", Refusals: 200, Within: time.Minute, Block: 10 * time.Minute}
	r := req("key:abuser", 2, 2, 1)
	r.Penalty = p

	// 3 enforcers × 10 checks every 100 ms: the key is offered 300/s against 2/s.
	refused, admitted := 0, 0
	var first bucket.Result
	var blockedAt time.Time
	for step := 0; step < 100 && blockedAt.IsZero(); step++ {
		for _, s := range es {
			for range 10 {
				res := f.take(s, r)
				switch {
				case res.Penalized:
					if blockedAt.IsZero() {
						blockedAt, first = f.clk.Now(), res
					}
				case res.Allowed():
					admitted++
				default:
					refused++
				}
			}
		}
		f.clk.Advance(100 * time.Millisecond)
	}
	if blockedAt.IsZero() {
		t.Fatalf("never penalized after %d refusals", refused)
	}
	// Every refusal the clients saw up to the block was counted, but for those still in
	// the caches (at most one refusal-cache interval's on each enforcer: 3 × 10 × 5 here).
	if refused < int(p.Refusals)-1 || refused > int(p.Refusals)+3*10*5 {
		t.Errorf("blocked after %d refusals seen (%d admitted), want %d (+ at most those cached)", refused, admitted, p.Refusals)
	}
	t.Logf("blocked at %v after %d refusals seen, %d admitted, %d store calls", blockedAt.Sub(t0), refused, admitted, f.next.calls.Load())
	st, now, _ := f.mem.PeekPenalty(context.Background(), "key:abuser", p)
	if !st.Blocked(now) || st.Count < p.Refusals {
		t.Fatalf("store's penalty state %+v at %d: not blocked", st, now)
	}
	if first.RetryAfter <= 0 || first.RetryAfter > p.Block {
		t.Errorf("penalized answer %+v: retry-after should run to the block's end (≤ %v)", first, p.Block)
	}
	// Let every enforcer hear of the block (each calls once the cache it holds expires),
	// then the block is answered from memory: no store call for the rest of it.
	for range 20 {
		for _, s := range es {
			f.take(s, r)
		}
		f.clk.Advance(100 * time.Millisecond)
	}
	calls := f.next.calls.Load()
	end := time.UnixMicro(st.Until)
	for f.clk.Now().Add(30 * time.Second).Before(end) {
		for _, s := range es {
			for range 5 {
				res := f.take(s, r)
				if !res.Penalized || res.Source != bucket.SourceRefusalCache || res.Allowed() {
					t.Fatalf("at %v, during the block: %+v, want penalized from the refusal cache", f.clk.Now().Sub(blockedAt), res)
				}
				if want := end.Sub(f.clk.Now()); res.RetryAfter != want {
					t.Fatalf("during the block: retry-after %v, want the block's end %v", res.RetryAfter, want)
				}
			}
		}
		f.clk.Advance(30 * time.Second)
	}
	if n := f.next.calls.Load() - calls; n != 0 {
		t.Errorf("%d store calls during the block, want none", n)
	}
	// Refusals during the block were not counted: after it the key is admitted again, and
	// a new window starts from nothing.
	f.clk.Advance(end.Sub(f.clk.Now()))
	for i, s := range es {
		if res := f.take(s, r); !res.Allowed() && res.Penalized {
			t.Errorf("enforcer %d after the block: %+v, want no longer penalized", i, res)
		}
	}
	if st, now, _ := f.mem.PeekPenalty(context.Background(), "key:abuser", p); st.Blocked(now) || st.Count > 10 {
		t.Errorf("after the block the store holds %+v: the refusals of the block were counted", st)
	}
}

// Without a penalty nothing is counted, and a failed call gives the refusals it carried
// back to the next one.
func TestPenaltyHandOver(t *testing.T) {
	f := newFixture(t, nil)
	r := req("key:a", 1, 1, 1)
	f.take(f.s, r)
	f.take(f.s, r) // refused by the store: the cache holds it
	f.take(f.s, r) // from the cache
	sh := f.s.shardOf("key:a")
	sh.mu.Lock()
	unpaid := sh.m["key:a"].unpaid
	sh.mu.Unlock()
	if unpaid != 0 {
		t.Fatalf("%d refusals counted without a penalty", unpaid)
	}
	e := &entry{penalty: &bucket.Penalty{Name: "p", Refusals: 5, Within: time.Minute, Block: time.Minute}}
	e.countRefusal(0)
	e.countRefusal(0)
	q := bucket.Request{Penalty: e.penalty}
	e.handOver(&q)
	if q.Refused != 2 || e.unpaid != 0 {
		t.Fatalf("handed over %d, kept %d; want 2, 0", q.Refused, e.unpaid)
	}
	e.penaltyUntil = 10
	e.countRefusal(5)
	if e.unpaid != 0 {
		t.Fatalf("a refusal while blocked was counted")
	}
}
