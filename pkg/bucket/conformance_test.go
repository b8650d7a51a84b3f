package bucket_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/bucket/buckettest"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/redis/go-redis/v9"
)

func TestConformanceMemory(t *testing.T) {
	fc := clock.NewFake(t0)
	buckettest.Run(t, buckettest.Harness{
		New:    func(*testing.T) bucket.Store { return bucket.NewMemory(fc, 0) },
		Clock:  fc,
		Source: bucket.SourceMemory,
	})
}

func TestConformanceRedis(t *testing.T) {
	n := testenv.Redis(t)
	c := redis.NewClient(&redis.Options{Addr: n.Addr})
	t.Cleanup(func() { _ = c.Close() })
	runRedisConformance(t, c, bucket.RedisOptions{})
}

func TestConformanceRedisCluster(t *testing.T) {
	cl := testenv.RedisCluster(t, testenv.ClusterOptions{Masters: 3})
	runRedisConformance(t, cl.Client(), bucket.RedisOptions{})
}

// The same suite with auto-pipelining: every guarantee holds per take.
func TestConformanceRedisPipeline(t *testing.T) {
	n := testenv.Redis(t)
	c := redis.NewClient(&redis.Options{Addr: n.Addr})
	t.Cleanup(func() { _ = c.Close() })
	runRedisConformance(t, c, bucket.RedisOptions{Pipeline: true})
}

func TestConformanceRedisClusterPipeline(t *testing.T) {
	cl := testenv.RedisCluster(t, testenv.ClusterOptions{Masters: 3})
	runRedisConformance(t, cl.Client(), bucket.RedisOptions{Pipeline: true, MaxBatch: 4})
}

func runRedisConformance(t *testing.T, c redis.UniversalClient, opts bucket.RedisOptions) {
	cmds := countCommands(c)
	st, err := bucket.NewRedis(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	buckettest.Run(t, buckettest.Harness{
		New:    func(*testing.T) bucket.Store { return st },
		Source: bucket.SourceRedis,
		Calls:  cmds.Load,
		Redis: &buckettest.RedisBackend{
			Client:      c,
			Key:         st.Key,
			ScriptCalls: st.Calls,
		},
	})
}

// countCommands adds a hook to c that counts every command (and pipelined command) it
// sends: what "never reaches Redis" is checked against.
func countCommands(c redis.UniversalClient) *atomic.Uint64 {
	h := &countHook{}
	c.AddHook(h)
	return &h.n
}

type countHook struct{ n atomic.Uint64 }

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(uint64(len(cmds)))
		return next(ctx, cmds)
	}
}

func TestConformanceInflightMemory(t *testing.T) {
	fc := clock.NewFake(t0)
	buckettest.RunInflight(t, buckettest.InflightHarness{
		New:    func(*testing.T) bucket.InflightStore { return bucket.NewMemory(fc, 0) },
		Clock:  fc,
		Source: bucket.SourceMemory,
	})
}

// The in-flight suite against a real Redis Cluster, its time injected through
// RedisOptions.Clock so timeouts are checked exactly without sleeping.
func TestConformanceInflightRedisCluster(t *testing.T) {
	cl := testenv.RedisCluster(t, testenv.ClusterOptions{Masters: 3})
	c := cl.Client()
	cmds := countCommands(c)
	fc := clock.NewFake(t0)
	st, err := bucket.NewRedis(c, bucket.RedisOptions{Clock: fc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	buckettest.RunInflight(t, buckettest.InflightHarness{
		New:     func(*testing.T) bucket.InflightStore { return st },
		Clock:   fc,
		Source:  bucket.SourceRedis,
		Calls:   cmds.Load,
		HeldKey: st.HeldKey,
		Redis:   &buckettest.RedisBackend{Client: c, Key: st.Key, ScriptCalls: st.Calls},
	})
}

func TestConformanceSettleMemory(t *testing.T) {
	fc := clock.NewFake(t0)
	buckettest.RunSettle(t, buckettest.SettleHarness{
		New:    func(*testing.T) buckettest.SettleStore { return bucket.NewMemory(fc, 0) },
		Clock:  fc,
		Source: bucket.SourceMemory,
	})
}

func TestConformanceSettleRedis(t *testing.T) {
	n := testenv.Redis(t)
	c := redis.NewClient(&redis.Options{Addr: n.Addr})
	t.Cleanup(func() { _ = c.Close() })
	runSettleConformance(t, c)
}

func TestConformanceSettleRedisCluster(t *testing.T) {
	cl := testenv.RedisCluster(t, testenv.ClusterOptions{Masters: 3})
	runSettleConformance(t, cl.Client())
}

func runSettleConformance(t *testing.T, c redis.UniversalClient) {
	cmds := countCommands(c)
	st, err := bucket.NewRedis(c, bucket.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	buckettest.RunSettle(t, buckettest.SettleHarness{
		New:    func(*testing.T) buckettest.SettleStore { return st },
		Source: bucket.SourceRedis,
		Calls:  cmds.Load,
	})
}
