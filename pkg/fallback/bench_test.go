package fallback

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
)

// trivialNext grants everything from memory, like a lease hit (it is a Cache).
type trivialNext struct{}

func (trivialNext) Take(_ context.Context, req *bucket.Request) (bucket.Result, error) {
	return bucket.Result{Granted: req.Want, Source: bucket.SourceLease}, nil
}

func (trivialNext) TakeCached(req *bucket.Request) (bucket.Result, bool) {
	if req.Validate() != nil {
		return bucket.Result{}, false
	}
	return bucket.Result{Granted: req.Want, Source: bucket.SourceLease}, true
}

// watchingNext asks for ctx.Done() like a store doing I/O (go-redis does).
type watchingNext struct{}

func (watchingNext) Take(ctx context.Context, req *bucket.Request) (bucket.Result, error) {
	select {
	case <-ctx.Done():
		return bucket.Result{}, ctx.Err()
	default:
	}
	return bucket.Result{Granted: req.Want, Source: bucket.SourceRedis}, nil
}

var benchReq = &bucket.Request{
	Identity: "key:0123456789abcdef",
	Limits:   []bucket.Limit{{Name: "per-second", Rate: 1e9, Burst: 1e12}},
	Want:     1,
}

func benchStore(b *testing.B, next bucket.Store, sharded bool) *Store {
	cfg := DefaultConfig()
	if sharded {
		shards := [...]string{"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"}
		cfg.Shard = func(id string) string { return shards[len(id)%3] }
	}
	s, err := New(next, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

func runBench(b *testing.B, st bucket.Store) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := st.Take(ctx, benchReq); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNextAlone is the baseline: the trivial next store called directly.
func BenchmarkNextAlone(b *testing.B) { runBench(b, trivialNext{}) }

// BenchmarkClosed is a check through a closed breaker, one shard.
func BenchmarkClosed(b *testing.B) { runBench(b, benchStore(b, trivialNext{}, false)) }

// BenchmarkClosedSharded adds the shard lookup (a breaker per Redis master).
func BenchmarkClosedSharded(b *testing.B) { runBench(b, benchStore(b, trivialNext{}, true)) }

// BenchmarkClosedParallel runs the sharded closed path on every P at once.
func BenchmarkClosedParallel(b *testing.B) {
	s := benchStore(b, trivialNext{}, true)
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Take(ctx, benchReq); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkClosedCall: the next store is no Cache, so every check is a call on its own
// goroutine, as on every check that reaches Redis.
func BenchmarkClosedCall(b *testing.B) {
	runBench(b, benchStore(b, watchingNext{}, true))
}

// BenchmarkOpenLocal is a check answered from the local table while the shard is down.
func BenchmarkOpenLocal(b *testing.B) {
	next := newFakeNext()
	next.set("key", down)
	cfg := DefaultConfig()
	cfg.Clock = clock.Real()
	cfg.Shard = shardOf
	cfg.OpenFor = time.Hour
	s, err := New(next, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for i := 0; i < cfg.TripAfter; i++ {
		if _, err := s.Take(context.Background(), benchReq); err != nil {
			b.Fatal(err)
		}
	}
	if s.State("key") != Open {
		b.Fatal("breaker did not open")
	}
	runBench(b, s)
}
