package lease

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/testenv"
)

func (c *counting) sightCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sights
}

// A key served by 2 of 10 enforcers is sized by 2: each call sights it (at most once per
// SightEvery), the store counts the enforcers that did within SightTTL, and the batches
// and Seen (pkg/fallback's local limits) follow that count; a count older than SightTTL
// is not believed, and an enforcer without an ID sends no sighting.
func TestSightingsSizeAKeyByItsEnforcers(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.ID, c.BusyHits = "enf-a", 1 })
	f.peers.Store(10)
	b := f.store(f.next, func(c *Config) { c.ID, c.BusyHits = "enf-b", 1 }, hooks{})
	r := req("k", 1000, 1000, 1)

	f.take(f.s, r)
	f.take(b, r)
	// A first sighting's count is not believed: the others serving the key may not have
	// sighted it yet.
	if n := f.s.Seen("k"); n != 0 {
		t.Fatalf("after enf-a's first call: Seen %d, want 0 (not believed yet)", n)
	}
	// Many calls within SightEvery sight once.
	before := f.next.sightCount()
	for range 50 {
		f.take(f.s, r)
		f.s.settle()
	}
	if n := f.next.sightCount() - before; n != 0 {
		t.Fatalf("%d sightings within SightEvery, want 0", n)
	}
	f.clk.Advance(time.Second)
	f.take(f.s, r)
	f.s.settle()
	if n := f.s.Seen("k"); n != 2 {
		t.Fatalf("enf-a after SightEvery: Seen %d, want 2", n)
	}

	// Batches are enf-a's part of two, not of ten: rate × Window / 2 = 50 at most.
	for range 200 {
		f.take(f.s, r)
		f.s.settle()
	}
	if got := f.s.batchFor("k"); got <= 1000*0.1/10 || got > 1000*0.1/2 {
		t.Fatalf("batch %d, want above N's %v and at most two enforcers' %v", got, 1000*0.1/10, 1000*0.1/2)
	}
	// A count older than SightTTL is not believed.
	f.clk.Advance(DefaultConfig().SightTTL)
	if n := f.s.Seen("k"); n != 0 {
		t.Fatalf("after SightTTL without a call: Seen %d, want 0", n)
	}
	// A key that is not busy is not sighted, and keeps N.
	d := f.store(f.next, func(c *Config) { c.ID = "enf-d" }, hooks{}) // BusyHits 3
	before = f.next.sightCount()
	f.take(d, req("quiet", 1000, 1000, 1))
	if n := f.next.sightCount() - before; n != 0 {
		t.Fatalf("a key seen once was sighted %d times", n)
	}
	// No ID: no sightings.
	c := f.store(f.next, nil, hooks{})
	before = f.next.sightCount()
	f.take(c, req("other", 1000, 1000, 1))
	if n := f.next.sightCount() - before; n != 0 || c.Seen("other") != 0 {
		t.Fatalf("an enforcer without an ID sent %d sightings", n)
	}
}

func TestSightConfig(t *testing.T) {
	for name, mod := range map[string]func(*Config){
		"long id":    func(c *Config) { c.ID = string(make([]byte, bucket.MaxSightLen+1)) },
		"no every":   func(c *Config) { c.ID, c.SightEvery = "e", 0 },
		"short ttl":  func(c *Config) { c.ID, c.SightTTL = "e", c.SightEvery },
		"ttl < ttl":  func(c *Config) { c.ID, c.SightEvery, c.SightTTL = "e", time.Millisecond, c.LeaseTTL/2 },
		"absurd ttl": func(c *Config) { c.ID, c.SightTTL = "e", bucket.MaxSightTTL+1 },
	} {
		c := DefaultConfig()
		mod(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// On a real Redis Cluster: three enforcers of a region of ten that serve one key count
// three, each of them.
func TestSightingsOnRedisCluster(t *testing.T) {
	c := testenv.RedisCluster(t, testenv.ClusterOptions{Masters: 3})
	r := req("sighted-key", 1000, 1000, 1)
	fc := clock.NewFake(time.Now()) // the enforcers' clock; Redis counts sightings on its own
	var stores []*Store
	for _, id := range []string{"enf-a", "enf-b", "enf-c"} {
		rs, err := bucket.NewRedis(c.Client(), bucket.RedisOptions{KeyPrefix: "sight:"})
		if err != nil {
			t.Fatal(err)
		}
		cfg := DefaultConfig()
		cfg.ID, cfg.Peers, cfg.SightEvery, cfg.BusyHits = id, func() int { return 10 }, 50*time.Millisecond, 1
		cfg.Clock = fc
		s, err := New(rs, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if _, err := s.Take(context.Background(), r); err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
	}
	// Each learns it at its next sighting, SightEvery later.
	fc.Advance(60 * time.Millisecond)
	for i, s := range stores {
		if _, err := s.Take(context.Background(), &bucket.Request{Identity: r.Identity, Limits: r.Limits, Want: 1000}); err != nil {
			t.Fatal(err)
		}
		if n := s.Seen(r.Identity); n != 3 {
			t.Fatalf("enforcer %d's count after its second sighting: %d, want 3", i, n)
		}
	}
}
