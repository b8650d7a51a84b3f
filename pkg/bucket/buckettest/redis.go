package buckettest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/redis/go-redis/v9"
)

// RedisBackend gives the suite the Redis behind a store.
type RedisBackend struct {
	// Client reaches the same Redis (a *redis.Client or *redis.ClusterClient).
	Client redis.UniversalClient
	// Key returns the key the store keeps identity's bucket name under.
	Key func(identity, name string) string
	// ScriptCalls counts the script calls the store made (bucket.Redis.Calls).
	ScriptCalls func() uint64
}

func (s *suite) redis(t *testing.T) {
	t.Run("Expiry", s.expiry)
	t.Run("RefusalWritesNothing", s.refusalWritesNothing)
	t.Run("HashTagPlacement", s.placement)
	t.Run("NoScriptRecovery", s.noscript)
}

func (s *suite) rb() *RedisBackend { return s.h.Redis }

// expiry: every written bucket expires when it would be full again, so an idle
// identity's keys vanish.
func (s *suite) expiry(t *testing.T) {
	ctx := context.Background()
	st, id := s.h.New(t), s.id(t, "k")
	c := s.rb().Client
	sl, fast := slow("slow", 5), bucket.Limit{Name: "fast", Rate: 100, Burst: 2}
	if r := s.take(t, st, id, 1, 0, sl, fast); r.Granted != 1 {
		t.Fatalf("take: %+v", r)
	}
	// slow: one token short of full, full again in 1024 s. Redis keeps expiries in whole
	// milliseconds: allow the store 2 ms of rounding up.
	ttl, err := c.PTTL(ctx, s.rb().Key(id, sl.Name)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl > tokenOfSlow+2*time.Millisecond || ttl < tokenOfSlow-s.h.tol() {
		t.Fatalf("slow bucket's PTTL %v, want about %v", ttl, tokenOfSlow)
	}
	// fast: full again 10 ms after the take; poll (bounded) until the key is gone.
	fk := s.rb().Key(id, fast.Name)
	if ttl, err := c.PTTL(ctx, fk).Result(); err != nil || ttl > 12*time.Millisecond {
		t.Fatalf("fast bucket's PTTL %v (%v), want <= 12ms", ttl, err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		n, err := c.Exists(ctx, fk).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("key %q still exists 2 s after its bucket was full again", fk)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n, _ := c.Exists(ctx, s.rb().Key(id, sl.Name)).Result(); n != 1 {
		t.Fatalf("the slow bucket's key vanished with the fast one's")
	}
}

// refusalWritesNothing: a refused request leaves no key behind, not even for buckets it
// could have taken from.
func (s *suite) refusalWritesNothing(t *testing.T) {
	ctx := context.Background()
	st, id := s.h.New(t), s.id(t, "k")
	empty, fresh := slow("empty", 1), slow("fresh", 5)
	s.take(t, st, id, 1, 0, empty)
	if r := s.take(t, st, id, 1, 0, fresh, empty); r.Granted != 0 || r.Limiting != 1 {
		t.Fatalf("take: %+v, want refused by %q", r, empty.Name)
	}
	k := s.rb().Key(id, fresh.Name)
	if n, err := s.rb().Client.Exists(ctx, k).Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS %q = %d (%v) after a refusal, want 0", k, n, err)
	}
}

// placement: every bucket of one identity is on one slot, whose hash tag is exactly the
// escaped identity; identities with braces are escaped, not split.
func (s *suite) placement(t *testing.T) {
	ctx := context.Background()
	st := s.h.New(t)
	cc, cluster := s.rb().Client.(*redis.ClusterClient)
	names := []string{"per-second", "per-minute", "x}{y", "%7D"}
	limits := make([]bucket.Limit, len(names))
	for i, n := range names {
		limits[i] = slow(n, 5)
	}
	for _, suffix := range []string{"plain", "a{b}c", "{x}", "}", "%7B", "{}"} {
		id := s.id(t, suffix)
		if r := s.take(t, st, id, 1, 0, limits...); r.Granted != 1 {
			t.Fatalf("take for %q: %+v", id, r)
		}
		tag := escape(id)
		for _, n := range names {
			k := s.rb().Key(id, n)
			if got := hashTag(k); got != tag {
				t.Fatalf("key %q of identity %q: hash tag %q, want %q", k, id, got, tag)
			}
			if e, err := s.rb().Client.Exists(ctx, k).Result(); err != nil || e != 1 {
				t.Fatalf("EXISTS %q = %d (%v): the store does not keep buckets under Key", k, e, err)
			}
			if !cluster {
				continue
			}
			slot, err := cc.ClusterKeySlot(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if int(slot) != bucket.Slot(id) {
				t.Fatalf("CLUSTER KEYSLOT %q = %d, bucket.Slot(%q) = %d", k, slot, id, bucket.Slot(id))
			}
		}
	}
}

// hashTag returns what Redis Cluster hashes: the part between the first '{' and the next
// '}', if not empty.
func hashTag(key string) string {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return key
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return key
	}
	return key[i+1 : i+1+j]
}

func escape(id string) string {
	return strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D").Replace(id)
}

// noscript: after SCRIPT FLUSH on every node, takes on every master succeed, costing one
// more script call the first time on each node.
func (s *suite) noscript(t *testing.T) {
	ctx := context.Background()
	st := s.h.New(t)
	c := s.rb().Client
	l := slow("ns", 5)

	// One identity per master (one for a single node), found from the client's slot map.
	byMaster := map[string]string{}
	masters := 1
	cc, cluster := c.(*redis.ClusterClient)
	if cluster {
		var mu sync.Mutex
		n := 0
		if err := cc.ForEachMaster(ctx, func(context.Context, *redis.Client) error {
			mu.Lock()
			n++
			mu.Unlock()
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		masters = n
	}
	for i := 0; len(byMaster) < masters && i < 10_000; i++ {
		id := s.id(t, fmt.Sprint(i))
		addr := ""
		if cluster {
			m, err := cc.MasterForKey(ctx, s.rb().Key(id, l.Name))
			if err != nil {
				t.Fatal(err)
			}
			addr = m.Options().Addr
		}
		if _, ok := byMaster[addr]; !ok {
			byMaster[addr] = id
		}
	}
	if len(byMaster) != masters {
		t.Fatalf("found identities on %d of %d masters", len(byMaster), masters)
	}
	// Make sure the script is cached, then flush it everywhere.
	for _, id := range byMaster {
		s.take(t, st, id, 1, 0, l)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatalf("SCRIPT FLUSH: %v", err)
	}
	for addr, id := range byMaster {
		before := s.rb().ScriptCalls()
		if r := s.take(t, st, id, 1, 0, l); r.Granted != 1 || r.Remaining != 3 {
			t.Fatalf("first take on %s after SCRIPT FLUSH: %+v", addr, r)
		}
		mid := s.rb().ScriptCalls()
		if r := s.take(t, st, id, 1, 0, l); r.Granted != 1 || r.Remaining != 2 {
			t.Fatalf("second take on %s after SCRIPT FLUSH: %+v", addr, r)
		}
		after := s.rb().ScriptCalls()
		if mid-before != 2 || after-mid != 1 {
			t.Fatalf("on %s: %d script calls for the first take after the flush (want 2: NOSCRIPT, then the script), %d for the next (want 1)",
				addr, mid-before, after-mid)
		}
	}
	ok, err := c.ScriptExists(ctx, bucket.ScriptSHA()).Result()
	if err != nil || len(ok) != 1 || !ok[0] {
		t.Fatalf("SCRIPT EXISTS after recovery: %v %v, want cached on every master", ok, err)
	}
}
