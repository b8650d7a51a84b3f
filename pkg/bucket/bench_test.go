package bucket_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/redis/go-redis/v9"
)

// benchLimits are two rules of one key ("100 a second, bursts of 200" and "5,000 a
// minute"), scaled up so a benchmark's takes are mostly granted: a grant reads and
// writes every bucket, the costlier path.
var benchLimits = []bucket.Limit{
	{Name: "per-second", Rate: 1e6, Burst: 2e6},
	{Name: "per-minute", Rate: 1e6, Burst: 6e7},
}

func benchIdentities(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("key:%08d", i)
	}
	return ids
}

// BenchmarkMemoryTake: one identity, two rules, the real clock (time.Now once a take).
func BenchmarkMemoryTake(b *testing.B) {
	m := bucket.NewMemory(clock.Real(), 0)
	req := &bucket.Request{Identity: "key:abc", Limits: benchLimits, Want: 1}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := m.Take(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMemoryTakeKeys: 100,000 identities, taken in turn from all procs.
func BenchmarkMemoryTakeKeys(b *testing.B) {
	m := bucket.NewMemory(clock.Real(), 0)
	ids := benchIdentities(100_000)
	ctx := context.Background()
	var next atomic.Uint64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req := &bucket.Request{Limits: benchLimits, Want: 1}
		for pb.Next() {
			req.Identity = ids[next.Add(1)%uint64(len(ids))]
			if _, err := m.Take(ctx, req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkRedisTake: takes per second through the Redis store with 1, 16 and 64
// concurrent callers, on a single node and on a 3-master cluster. Takes spread over 1,024
// identities (so over every master). Each alone (one round trip a take) and with
// RedisOptions.Pipeline (concurrent takes share a pipeline). ns/op is wall time per take across all callers;
// takes/s is the throughput; calls/take counts script calls.
func BenchmarkRedisTake(b *testing.B) {
	b.Run("single", func(b *testing.B) {
		n := testenv.Redis(b)
		c := redis.NewClient(&redis.Options{Addr: n.Addr, PoolSize: 64})
		b.Cleanup(func() { _ = c.Close() })
		benchRedis(b, c)
	})
	b.Run("cluster", func(b *testing.B) {
		cl := testenv.RedisCluster(b, testenv.ClusterOptions{Masters: 3})
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), PoolSize: 64})
		b.Cleanup(func() { _ = c.Close() })
		benchRedis(b, c)
	})
}

func benchRedis(b *testing.B, c redis.UniversalClient) {
	b.Run("alone", func(b *testing.B) { benchRedisStore(b, c, bucket.RedisOptions{}) })
	b.Run("pipeline", func(b *testing.B) { benchRedisStore(b, c, bucket.RedisOptions{Pipeline: true}) })
}

func benchRedisStore(b *testing.B, c redis.UniversalClient, opts bucket.RedisOptions) {
	st, err := bucket.NewRedis(c, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	if err := st.Preload(context.Background()); err != nil {
		b.Fatal(err)
	}
	ids := benchIdentities(1024)
	for _, callers := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			var next atomic.Int64
			var failed atomic.Value
			calls0 := st.Calls()
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for g := 0; g < callers; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					req := &bucket.Request{Limits: benchLimits, Want: 1}
					ctx := context.Background()
					for {
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						req.Identity = ids[i%int64(len(ids))]
						if _, err := st.Take(ctx, req); err != nil {
							failed.CompareAndSwap(nil, err)
							return
						}
					}
				}()
			}
			wg.Wait()
			el := time.Since(start)
			b.StopTimer()
			if err := failed.Load(); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/el.Seconds(), "takes/s")
			b.ReportMetric(float64(st.Calls()-calls0)/float64(b.N), "calls/take")
		})
	}
}

// BenchmarkMemoryAcquire: one in-flight slot acquired and released per op (what a request
// under an in-flight limit costs), beside BenchmarkMemoryTake; the real clock.
func BenchmarkMemoryAcquire(b *testing.B) {
	m := bucket.NewMemory(clock.Real(), 0)
	h := &bucket.Hold{Identity: "key:abc", Name: "r/inflight", Handle: "h", Cap: 20, Timeout: 30 * time.Second}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if r, err := m.Acquire(ctx, h); err != nil || !r.Held {
			b.Fatal(r, err)
		}
		if err := m.Release(ctx, h); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRedisAcquire: one caller on a single Redis node, over 1,024 identities: the
// plain take (two buckets), an in-flight acquire alone, and an acquire with its release.
// Each is one script call a step (calls/op).
func BenchmarkRedisAcquire(b *testing.B) {
	n := testenv.Redis(b)
	c := redis.NewClient(&redis.Options{Addr: n.Addr})
	b.Cleanup(func() { _ = c.Close() })
	st, err := bucket.NewRedis(c, bucket.RedisOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	ctx := context.Background()
	if err := st.Preload(ctx); err != nil {
		b.Fatal(err)
	}
	ids := benchIdentities(1024)
	handles := make([]string, 1<<16)
	for i := range handles {
		handles[i] = fmt.Sprintf("h%05d", i)
	}
	run := func(name string, step func(i int) error) {
		b.Run(name, func(b *testing.B) {
			calls0 := st.Calls()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if err := step(i); err != nil {
					b.Fatal(err)
				}
				i++
			}
			b.ReportMetric(float64(st.Calls()-calls0)/float64(b.N), "calls/op")
		})
	}
	req := &bucket.Request{Limits: benchLimits, Want: 1}
	run("take", func(i int) error {
		req.Identity = ids[i%len(ids)]
		_, err := st.Take(ctx, req)
		return err
	})
	h := &bucket.Hold{Name: "r/inflight", Cap: bucket.MaxConcurrent, Timeout: time.Minute}
	run("acquire", func(i int) error {
		h.Identity, h.Handle = ids[i%len(ids)], handles[i%len(handles)]
		_, err := st.Acquire(ctx, h)
		return err
	})
	run("acquire+release", func(i int) error {
		h.Identity, h.Handle = ids[i%len(ids)], "pair"
		if _, err := st.Acquire(ctx, h); err != nil {
			return err
		}
		return st.Release(ctx, h)
	})
}
