package bucket_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/redis/go-redis/v9"
)

func newPipelined(t testing.TB, c bucket.RedisClient) *bucket.Redis {
	t.Helper()
	st, err := bucket.NewRedis(c, bucket.RedisOptions{Pipeline: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// TestRedisPipelineErrorsPerCommand: in a shared pipeline, a command that fails (its
// client may not touch the "bad" identity's keys: NOPERM) fails for its caller only; the
// others are granted, and the calls counter counts every command.
func TestRedisPipelineErrorsPerCommand(t *testing.T) {
	n := testenv.Redis(t)
	admin := n.Client()
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "limited", "on", ">pw", "~allot:{good*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: n.Addr, Username: "limited", Password: "pw"})
	t.Cleanup(func() { _ = c.Close() })
	st := newPipelined(t, c)
	if err := st.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	limits := []bucket.Limit{{Name: "s", Rate: 1e6, Burst: 1e6}}
	const goroutines, rounds = 32, 50
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("good:%d", g)
			if g%4 == 0 {
				id = "bad"
			}
			req := &bucket.Request{Identity: id, Limits: limits, Want: 1}
			for range rounds {
				r, err := st.Take(ctx, req)
				switch {
				case id == "bad" && (err == nil || !strings.Contains(err.Error(), "NOPERM")):
					errs <- fmt.Errorf("take on a forbidden key: %+v, %v; want NOPERM", r, err)
					return
				case id != "bad" && (err != nil || r.Granted != 1):
					errs <- fmt.Errorf("take for %q: %+v, %v", id, r, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := st.Calls(); got != goroutines*rounds {
		t.Fatalf("Calls() = %d after %d takes", got, goroutines*rounds)
	}
}

// TestRedisPipelineDeadline: while its shard is stalled, a caller whose ctx ends gets
// ctx.Err() on time, even when it shares a batch with callers of later deadlines; the
// store works again once the shard answers.
func TestRedisPipelineDeadline(t *testing.T) {
	n := testenv.Redis(t)
	c := redis.NewClient(&redis.Options{Addr: n.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	st := newPipelined(t, c)
	req := &bucket.Request{Identity: "k", Limits: []bucket.Limit{{Name: "s", Rate: 1, Burst: 50}}, Want: 1}
	if _, err := st.Take(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	n.Pause(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			timeout, bound := 50*time.Millisecond, 500*time.Millisecond
			if i%2 == 1 {
				timeout, bound = 1500*time.Millisecond, 3*time.Second
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			start := time.Now()
			r, err := st.Take(ctx, req)
			// The long ones' batch ends at their deadline too: an i/o timeout, or ctx.Err().
			short := i%2 == 0
			if el := time.Since(start); err == nil || (short && !errors.Is(err, context.DeadlineExceeded)) || el > bound {
				errs <- fmt.Errorf("take with a %v deadline on a paused server: %+v, %v after %v; want the deadline within %v", timeout, r, err, el, bound)
			}
		}()
	}
	wg.Wait()
	n.Unpause(t)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for { // bounded poll: the stalled batch may still be failing
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r, err := st.Take(ctx, req)
		cancel()
		if err == nil && r.Granted == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("take after the server is back: %+v, %v", r, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRedisPipelineClose: Close is idempotent and stops the batchers (goleak checks);
// Takes after Close send alone and still work.
func TestRedisPipelineClose(t *testing.T) {
	cl := testenv.RedisCluster(t, testenv.ClusterOptions{Masters: 3})
	st, err := bucket.NewRedis(cl.Client(), bucket.RedisOptions{Pipeline: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	limits := []bucket.Limit{{Name: "s", Rate: 1, Burst: 10}}
	for i := range 20 {
		if r, err := st.Take(ctx, &bucket.Request{Identity: fmt.Sprint(i), Limits: limits, Want: 1}); err != nil || r.Granted != 1 {
			t.Fatalf("take: %+v, %v", r, err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if r, err := st.Take(ctx, &bucket.Request{Identity: "0", Limits: limits, Want: 1}); err != nil || r.Granted != 1 || r.Remaining != 8 {
		t.Fatalf("take after Close: %+v, %v", r, err)
	}
}

func TestRedisOptionsMaxBatch(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	if _, err := bucket.NewRedis(c, bucket.RedisOptions{Pipeline: true, MaxBatch: -1}); err == nil || !strings.Contains(err.Error(), "MaxBatch -1") {
		t.Fatalf("MaxBatch -1: %v, want an error naming it", err)
	}
}
