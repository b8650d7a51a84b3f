package bucket_test

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/testenv"
)

// The quota counter script on a real Redis: an add answers the total; a counter below an
// op's floor is raised to it (max, never the sum); the key expires when told; a node that
// lost the script (SCRIPT FLUSH) is sent it again.
func TestRedisAddCounters(t *testing.T) {
	ctx := context.Background()
	cl := testenv.Redis(t).Client()
	rs := newRedis(t, cl)
	start := time.Now().UTC().Truncate(24 * time.Hour)
	exp := start.Add(48 * time.Hour)
	op := func(id string, delta, floor int64) bucket.CounterOp {
		return bucket.CounterOp{Identity: id, Name: "r/day", Start: start, ExpireAt: exp, Delta: delta, Floor: floor}
	}
	ops := []bucket.CounterOp{op("key:a", 5, 5), op("key:b", 0, 0), op("key:{c}", 3, 3)}
	if err := rs.AddCounters(ctx, ops); err != nil {
		t.Fatal(err)
	}
	if ops[0].Total != 5 || ops[1].Total != 0 || ops[2].Total != 3 || ops[0].Err != nil {
		t.Fatalf("first batch: %+v", ops)
	}
	// Adds accumulate; a floor under the total changes nothing.
	ops = []bucket.CounterOp{op("key:a", 2, 4)}
	if err := rs.AddCounters(ctx, ops); err != nil || ops[0].Total != 7 {
		t.Fatalf("add: %+v %v", ops, err)
	}
	// The counter lost its counts: the floor raises it, the add is inside the floor.
	if err := cl.Del(ctx, rs.CounterKey("key:a", "r/day", start)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	ops = []bucket.CounterOp{op("key:a", 1, 8)}
	if err := rs.AddCounters(ctx, ops); err != nil || ops[0].Total != 8 {
		t.Fatalf("after a loss and SCRIPT FLUSH: %+v %v, want 8 (known 7 + 1)", ops, err)
	}
	ttl, err := cl.PTTL(ctx, rs.CounterKey("key:a", "r/day", start)).Result()
	if err != nil || ttl <= 0 || ttl > time.Until(exp)+time.Second {
		t.Fatalf("TTL %v (%v), want it to expire at %v", ttl, err, exp)
	}
	// A negative add (counts given back) lowers it.
	ops = []bucket.CounterOp{op("key:a", -2, 0)}
	if err := rs.AddCounters(ctx, ops); err != nil || ops[0].Total != 6 {
		t.Fatalf("negative add: %+v %v", ops, err)
	}
}
