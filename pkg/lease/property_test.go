package lease

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
)

// perKey counts what the next store granted, per identity. Safe for concurrent use.
type perKey struct {
	next    bucket.Store
	mu      sync.Mutex // mu guards granted
	granted map[string]int64
}

func (p *perKey) Take(ctx context.Context, req *bucket.Request) (bucket.Result, error) {
	res, err := p.next.Take(ctx, req)
	p.mu.Lock()
	p.granted[req.Identity] += res.Granted
	p.mu.Unlock()
	return res, err
}

func (p *perKey) get(id string) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.granted[id]
}

// rawHeld is the tokens an entry holds, expired or not (no side effects).
func (s *Store) rawHeld(key string) int64 {
	sh := s.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.m[key]; e != nil {
		return e.held()
	}
	return 0
}

// TestNeverOver drives several enforcers (separate Stores) over one bucket store through a
// random timeline — costs, partial requests, clock steps, background refills landing at
// random moments, limit changes, a tiny table that evicts — and checks at every step that
// no enforcer admitted more of a key than the store granted it, that the fleet stays within
// burst + rate × elapsed, and at the end that every granted token is accounted for:
// admitted, still held, or dropped (expired, limits changed, evicted).
func TestNeverOver(t *testing.T) {
	seeds := 12
	if testing.Short() {
		seeds = 3
	}
	for seed := range seeds {
		neverOver(t, uint64(seed))
	}
}

func neverOver(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	clk := clock.NewFake(t0)
	mem := bucket.NewMemory(clk, 0)
	const enforcers = 3
	keys := []string{"a", "b", "c"}
	fixed := map[string]bucket.Limit{
		"a": {Name: "s", Rate: 200, Burst: 50},
		"b": {Name: "s", Rate: 20, Burst: 5},
	}
	cLimits := []bucket.Limit{{Name: "s", Rate: 100, Burst: 30}, {Name: "s", Rate: 300, Burst: 60}, {Name: "t", Rate: 100, Burst: 30}}
	cNow := 0
	var peers atomic.Int64
	peers.Store(3)

	type enf struct {
		s        *Store
		next     *perKey
		rec      *recorder
		admitted map[string]int64
	}
	es := make([]*enf, enforcers)
	for i := range es {
		e := &enf{next: &perKey{next: mem, granted: map[string]int64{}}, rec: &recorder{}, admitted: map[string]int64{}}
		cfg := DefaultConfig()
		cfg.Clock = clk
		cfg.Peers = func() int { return int(peers.Load()) }
		cfg.BusyHits = 1 + rng.IntN(3)
		cfg.Observer = e.rec.observe
		if seed%2 == 1 {
			cfg.MaxKeys = 2 // fewer slots than keys: evictions all the time
		}
		s, err := New(e.next, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		e.s = s
		es[i] = e
	}

	ctx := context.Background()
	for step := range 4000 {
		switch x := rng.IntN(100); {
		case x < 10:
			clk.Advance(time.Duration(rng.IntN(40)) * time.Millisecond)
		case x < 12:
			clk.Advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
		case x < 14:
			cNow = rng.IntN(len(cLimits))
		case x < 16:
			peers.Store(1 + rng.Int64N(3))
		case x < 20:
			for _, e := range es {
				e.s.settle()
			}
		}
		e := es[rng.IntN(enforcers)]
		id := keys[rng.IntN(len(keys))]
		l := fixed[id]
		if id == "c" {
			l = cLimits[cNow]
		}
		want := int64(1 + rng.IntN(3))
		r := &bucket.Request{Identity: id, Limits: []bucket.Limit{l}, Want: want}
		if rng.IntN(4) == 0 {
			r.Min = 1 // a partial request
		}
		res, err := e.s.Take(ctx, r)
		if err != nil {
			t.Fatalf("seed %d step %d: %v", seed, step, err)
		}
		if res.Granted != 0 && (res.Granted < r.MinGrant() || res.Granted > r.Want) {
			t.Fatalf("seed %d step %d: granted %d outside [%d, %d]", seed, step, res.Granted, r.MinGrant(), r.Want)
		}
		e.admitted[id] += res.Granted
		if a, g := e.admitted[id], e.next.get(id); a > g {
			t.Fatalf("seed %d step %d: enforcer admitted %d of %q, store granted it %d", seed, step, a, id, g)
		}
		if l, ok := fixed[id]; ok {
			var total int64
			for _, e := range es {
				total += e.admitted[id]
			}
			elapsed := clk.Now().Sub(t0).Seconds()
			if bound := l.Burst + l.Rate*elapsed; float64(total) > bound+1e-6 {
				t.Fatalf("seed %d step %d: fleet admitted %d of %q, bound %.3f", seed, step, total, id, bound)
			}
		}
	}
	for i, e := range es {
		e.s.settle()
		var admitted, granted, held int64
		for _, id := range keys {
			admitted += e.admitted[id]
			granted += e.next.get(id)
			held += e.s.rawHeld(id)
		}
		dropped := e.rec.tokens[EventExpired].Load() + e.rec.tokens[EventLimitsChanged].Load() + e.rec.tokens[EventEvicted].Load()
		if granted != admitted+held+dropped {
			t.Fatalf("seed %d enforcer %d: granted %d != admitted %d + held %d + dropped %d",
				seed, i, granted, admitted, held, dropped)
		}
		if seed == 0 && i == 0 {
			t.Logf("enforcer 0: granted %d, admitted %d, held %d, dropped %d; lease hits %d, refusal hits %d, calls %d, refills %d",
				granted, admitted, held, dropped, e.rec.n[EventLeaseHit].Load(), e.rec.n[EventRefusalHit].Load(),
				e.rec.n[EventCall].Load(), e.rec.n[EventRefill].Load())
		}
	}
}
