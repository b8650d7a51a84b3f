package enforcer

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/quota"
	"github.com/allot-dev/allot/pkg/rules"
)

// benchRig is a rig on the real clock: a fake clock's lock would dominate a parallel run.
func benchRig(b testing.TB) *rig {
	return newRig(b, benchRules, func(clock.Clock) bucket.Store { return bucket.NewMemory(clock.Real(), 0) },
		func(c *Config) { c.Clock = clock.Real() })
}

const benchRules = `
rules:
  - id: default
    limits:
      - {name: second, rate: 1000000, per: 1s}
      - {name: minute, rate: 60000000, per: 1m}
  - id: pro-search
    match: {plan: pro, endpoint: "GET /v1/search"}
    limits: [{name: second, rate: 1000000, per: 1s}]
  - id: per-ip
    by: ip
    limits: [{name: second, rate: 1000000, per: 1s}]
`

func benchKeys(n int) []Request {
	reqs := make([]Request, n)
	for i := range reqs {
		reqs[i] = Request{Attrs: rules.Attrs{APIKey: "key-" + strconv.Itoa(i), Plan: "pro", Endpoint: "GET /v1/search"}}
	}
	return reqs
}

// BenchmarkCheck is the hot path with the exact in-memory store: match, one take per
// enforcing rule, metrics. It allocates nothing: Match finds the identity strings in the
// snapshot's identity cache.
func BenchmarkCheck(b *testing.B) {
	r := benchRig(b)
	reqs := benchKeys(1024)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := r.e.Check(ctx, &reqs[i&1023]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckSettle is BenchmarkCheck for checks that ask to settle (an estimate, a
// marker per rule that took, a handle), each settled once after: beside BenchmarkCheck,
// what settling costs a check with the in-memory store.
func BenchmarkCheckSettle(b *testing.B) {
	r := benchRig(b)
	reqs := benchKeys(1024)
	for i := range reqs {
		reqs[i].Settle = true
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d, err := r.e.Check(ctx, &reqs[i&1023])
		if err != nil || d.SettleHandle == "" {
			b.Fatal(d, err)
		}
		if _, err := r.e.Settle(ctx, d.SettleHandle, 1); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCheckParallel(b *testing.B) {
	r := benchRig(b)
	reqs := benchKeys(1024)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, err := r.e.Check(ctx, &reqs[i&1023]); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}

func TestCheckAllocations(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation count is measured in full runs")
	}
	r := benchRig(t)
	req := Request{Attrs: rules.Attrs{APIKey: "k", Plan: "pro", Endpoint: "GET /v1/search"}}
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := r.e.Check(ctx, &req); err != nil {
			t.Fatal(err)
		}
	})
	// Match finds "key:k" in the snapshot's identity cache; the memory store and the rest
	// allocate nothing.
	if allocs != 0 {
		t.Fatalf("Check allocates %v times per call, want 0", allocs)
	}
}

// BenchmarkCheckInflight is BenchmarkCheck with an in-flight limit on pro-search beside its
// rate: each op is a check that acquires a slot and answers a handle, then its release.
// The handle (random id, encoding) is what it allocates beyond the plain check.
func BenchmarkCheckInflight(b *testing.B) {
	rules := strings.Replace(benchRules, "limits: [{name: second, rate: 1000000, per: 1s}]\n  - id: per-ip",
		"limits: [{name: second, rate: 1000000, per: 1s}, {name: inflight, concurrent: 100, timeout: 30s}]\n  - id: per-ip", 1)
	r := newRig(b, rules, func(clock.Clock) bucket.Store { return bucket.NewMemory(clock.Real(), 0) },
		func(c *Config) { c.Clock = clock.Real() })
	reqs := benchKeys(1024)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d, err := r.e.Check(ctx, &reqs[i&1023])
		if err != nil || d.Handle == "" {
			b.Fatal(d, err)
		}
		if err := r.e.Release(ctx, d.Handle); err != nil {
			b.Fatal(err)
		}
	}
}

// countingCounters counts the counter batches a quota table sends.
type countingCounters struct {
	*quota.Memory
	calls atomic.Int64
}

func (c *countingCounters) AddCounters(ctx context.Context, ops []bucket.CounterOp) error {
	c.calls.Add(1)
	return c.Memory.AddCounters(ctx, ops)
}

// BenchmarkCheckQuota is BenchmarkCheck with a calendar quota on pro-search beside its
// rate: the quota is decided from memory, and the counter is called only for each key's
// first check of the period (1024 keys) and the flusher's batches; counter-calls/op
// reports it.
func BenchmarkCheckQuota(b *testing.B) {
	rules := strings.Replace(benchRules, "limits: [{name: second, rate: 1000000, per: 1s}]\n  - id: per-ip",
		"limits: [{name: second, rate: 1000000, per: 1s}, {name: daily, quota: 1000000000000, period: day}]\n  - id: per-ip", 1)
	cc := &countingCounters{Memory: quota.NewMemory()}
	r := newRig(b, rules, func(clock.Clock) bucket.Store { return bucket.NewMemory(clock.Real(), 0) },
		func(c *Config) {
			c.Clock = clock.Real()
			tb, err := quota.New(cc, quota.DefaultConfig())
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = tb.Close() })
			c.Quotas = tb
		})
	reqs := benchKeys(1024)
	ctx := context.Background()
	for i := range reqs { // every key's first read, before the clock starts
		if _, err := r.e.Check(ctx, &reqs[i]); err != nil {
			b.Fatal(err)
		}
	}
	before := cc.calls.Load()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d, err := r.e.Check(ctx, &reqs[i&1023])
		if err != nil || !d.Allowed {
			b.Fatal(d, err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(cc.calls.Load()-before)/float64(b.N), "counter-calls/op")
}
