package lease

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/loadgen"
	"golang.org/x/time/rate"
)

// BenchmarkFastPath measures a leased check — validation, key lookup in a table of 10,000
// keys, one clock read, spending from the lease — next to golang.org/x/time/rate's Allow,
// alone and behind a map lookup in a map of the same size, in the same run.
//
//	go test -run '^$' -bench FastPath -benchmem ./pkg/lease
func BenchmarkFastPath(b *testing.B) {
	const others = 10_000
	hot := "key:hot-0001"

	b.Run("lease", func(b *testing.B) {
		s, r := leasedStore(b, hot, others)
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			if res, err := s.Take(ctx, r); err != nil || res.Granted != 1 {
				b.Fatalf("%+v %v", res, err)
			}
		}
	})
	b.Run("lease-parallel", func(b *testing.B) {
		s, r := leasedStore(b, hot, others)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			ctx := context.Background()
			for pb.Next() {
				s.Take(ctx, r)
			}
		})
	})
	// Many leased keys checked in a Zipf mix (s = 1.1, as bench-load): the table's
	// bookkeeping on a hit (its recency order) is paid on keys other than the last one.
	b.Run("lease-zipf", func(b *testing.B) {
		s, reqs := leasedKeys(b, others)
		keys := loadgen.NewKeys(others, 1.1, 1)
		seq := make([]int32, 1<<16)
		for i := range seq {
			seq[i] = int32(keys.Next())
		}
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		i := 0
		for b.Loop() {
			if res, err := s.Take(ctx, reqs[seq[i&(len(seq)-1)]]); err != nil || res.Granted != 1 {
				b.Fatalf("%+v %v", res, err)
			}
			i++
		}
	})
	b.Run("rate.Allow", func(b *testing.B) {
		lim := rate.NewLimiter(rate.Limit(bucket.MaxRate), 1e9)
		b.ReportAllocs()
		for b.Loop() {
			if !lim.Allow() {
				b.Fatal("refused")
			}
		}
	})
	b.Run("rate.Allow+map", func(b *testing.B) {
		m := make(map[string]*rate.Limiter, others+1)
		for i := range others {
			m["key:"+strconv.Itoa(i)] = rate.NewLimiter(1, 1)
		}
		m[hot] = rate.NewLimiter(rate.Limit(bucket.MaxRate), 1e9)
		b.ReportAllocs()
		for b.Loop() {
			if !m[hot].Allow() {
				b.Fatal("refused")
			}
		}
	})
}

// benchStore returns a Store over a memory store on the real clock that leases a key on its
// first busy check (BusyHits 1), closed when the benchmark ends.
func benchStore(b *testing.B) *Store {
	cfg := DefaultConfig()
	cfg.BusyHits = 1
	s, err := New(bucket.NewMemory(clock.Real(), 0), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// BenchmarkQuietCall measures the check of a quiet key — one the lease does not hold, so
// every check is a call to the next store (bucket.Memory here) — over 10,000 such keys
// in turn: the path of most keys of a long tail. It allocates nothing.
//
//	go test -run '^$' -bench QuietCall -benchmem ./pkg/lease
func BenchmarkQuietCall(b *testing.B) {
	const n = 10_000
	s := benchStore(b)
	reqs := make([]*bucket.Request, n)
	for i := range reqs {
		reqs[i] = req("key:"+strconv.Itoa(i), 1, 1_000_000, 1)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		if res, err := s.Take(ctx, reqs[i%n]); err != nil || res.Source == bucket.SourceLease || res.Granted != 1 {
			b.Fatalf("%+v %v", res, err)
		}
		i++
	}
}

// leasedStore returns a Store on the real clock whose table holds others quiet keys and one
// hot key with a lease far larger than a benchmark spends (rate 1e9/s: a batch of 1e8), so
// the loop measures the leased path; the rare refill or TTL miss is part of the measure.
func leasedStore(b *testing.B, hot string, others int) (*Store, *bucket.Request) {
	s := benchStore(b)
	ctx := context.Background()
	q := req("", 10, 10, 1)
	for i := range others {
		q.Identity = "key:" + strconv.Itoa(i)
		s.Take(ctx, q)
	}
	r := req(hot, bucket.MaxRate, bucket.MaxBurst, 1)
	for range 1 << 16 { // grow the demand, and with it the batch, to its cap
		s.Take(ctx, r)
	}
	s.settle()
	if res, _ := s.Take(ctx, r); res.Source != bucket.SourceLease {
		b.Fatalf("hot key not leased: %+v", res)
	}
	return s, r
}

// leasedKeys returns a Store on the real clock holding n keys, each leased with a batch far
// larger than a benchmark spends (as leasedStore's hot key), and a request for each.
func leasedKeys(b *testing.B, n int) (*Store, []*bucket.Request) {
	s := benchStore(b)
	ctx := context.Background()
	reqs := make([]*bucket.Request, n)
	for i := range reqs {
		reqs[i] = req("key:"+strconv.Itoa(i), bucket.MaxRate, bucket.MaxBurst, 1)
		for range 64 { // grow the demand, and with it the batch
			s.Take(ctx, reqs[i])
		}
	}
	s.settle()
	for i, r := range reqs {
		if res, _ := s.Take(ctx, r); res.Source != bucket.SourceLease {
			b.Fatalf("key %d not leased: %+v", i, res)
		}
	}
	return s, reqs
}

// BenchmarkTableMemory offers 1,000,000 distinct keys (each checked once, as a client
// inventing keys would) and reports the table's size and the heap it holds, against the
// configured bound, and the heap objects per key: each is one the collector marks in every
// cycle, so they set how long a cycle's mark takes.
//
//	go test -run '^$' -bench TableMemory -benchtime 1x ./pkg/lease
func BenchmarkTableMemory(b *testing.B) {
	const offered = 1_000_000
	for b.Loop() {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		base, baseObjects := ms.HeapAlloc, ms.HeapObjects

		next, _ := script(grantAll)
		cfg := DefaultConfig()
		cfg.Clock = clock.NewFake(t0)
		s, err := New(next, cfg)
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		r := req("", 100, 100, 1)
		var peak uint64
		start := time.Now()
		for i := range offered {
			r.Identity = "invented-key:" + strconv.Itoa(i)
			if _, err := s.Take(ctx, r); err != nil {
				b.Fatal(err)
			}
			if (i+1)%(offered/10) == 0 {
				runtime.GC()
				runtime.ReadMemStats(&ms)
				peak = max(peak, ms.HeapAlloc-base)
			}
		}
		elapsed := time.Since(start)
		runtime.GC()
		runtime.ReadMemStats(&ms)
		heap, objects := ms.HeapAlloc-base, ms.HeapObjects-baseObjects
		n := s.Len()
		if n > cfg.MaxKeys {
			b.Fatalf("table holds %d keys, bound %d", n, cfg.MaxKeys)
		}
		b.ReportMetric(float64(n), "keys")
		b.ReportMetric(float64(cfg.MaxKeys), "max-keys")
		b.ReportMetric(float64(heap), "heap-bytes")
		b.ReportMetric(float64(peak), "peak-heap-bytes")
		b.ReportMetric(float64(heap)/float64(n), "bytes/key")
		b.ReportMetric(float64(objects)/float64(n), "objects/key") // what the collector marks
		b.ReportMetric(float64(elapsed.Nanoseconds())/offered, "ns/new-key")
		runtime.KeepAlive(s)
		s.Close()
	}
}
