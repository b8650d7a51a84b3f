package e2e

import (
	"encoding/json"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/enforcer/overrides"
)

// The enforcer's side of a large share set, for BenchmarkBalancerScale: what an
// overrides.Watcher does with a set when it lists it (a new enforcer, a new leader's
// first version: every chunk) and with a new version in which one chunk changed, on the
// exported pieces it is built of — contract.DecodeChunk for each chunk it mirrors, the
// entries assembled, Holder.Apply — in this process, without etcd (the list or watch
// transfer is not in these figures).

// applyResult is the apply path on one set size.
type applyResult struct {
	Entries int     `json:"entries"`
	Chunks  int     `json:"chunks"`
	Bytes   float64 `json:"bytes"` // Σ the chunks' encodings: what etcd holds and a list transfers
	// FullMs: every chunk decoded, the entries assembled and applied (the best of a few);
	// FullCPUMs the CPU this process used meanwhile (the collector's workers too).
	FullMs    float64 `json:"full_ms"`
	FullCPUMs float64 `json:"full_cpu_ms"`
	// VersionMs: one chunk decoded (the rest mirrored), the whole set assembled and
	// applied: Holder.Apply rebuilds its table for every version (the best of a few);
	// VersionCPUMs likewise.
	VersionMs    float64 `json:"version_ms"`
	VersionCPUMs float64 `json:"version_cpu_ms"`
	// HeapMiB is the live heap the Watcher's mirror (the decoded chunks) and the Holder's
	// table keep; TableMiB the table alone.
	HeapMiB  float64 `json:"heap_mib"`
	TableMiB float64 `json:"table_mib"`
}

// measureApply measures the apply path on a set of n entries, each an identity of its
// own with one region at 0.98 (the shape of a tail key used from one region).
func measureApply(b *testing.B, n int) *applyResult {
	const rev = 7
	entries := make([]contract.Entry, n)
	for i := range entries {
		sh := map[string]float64{}
		for r, name := range scaleRegions {
			sh[name] = 0.01
			if r == i%len(scaleRegions) {
				sh[name] = 0.98
			}
		}
		entries[i] = contract.Entry{Rule: "default", Identity: "key:t" + strconv.Itoa(i), Shares: sh}
	}
	writes, versions := contract.NewChunker(contract.MaxChunkBytes).Next(entries, rev, 1)
	entries = nil
	data := make([][]byte, len(versions))
	res := &applyResult{Entries: n, Chunks: len(versions)}
	for _, w := range writes {
		data[w.Index] = w.Data
		res.Bytes += float64(len(w.Data))
	}
	head := contract.Head{LeaderRev: rev, Version: 1, Chunks: len(versions), Entries: n, PublishedAt: time.Now(),
		Regions: scaleRegions, Phase: "target", ChunkVersions: versions}
	reps := 3
	if n > 200_000 {
		reps = 1 // seconds each
	}
	newHolder := func() *overrides.Holder {
		hc := overrides.DefaultConfig()
		hc.Region = scaleRegions[0]
		h, err := overrides.NewHolder(hc)
		if err != nil {
			b.Fatal(err)
		}
		return h
	}
	var h *overrides.Holder
	var mirror [][]contract.Entry
	var base, m1 uint64
	for rep := range reps {
		h, mirror = nil, nil
		m0 := liveHeap()
		if rep == 0 {
			base = m0
		}
		h = newHolder()
		began, cpu := time.Now(), selfCPU()
		mirror = make([][]contract.Entry, len(data))
		for i, d := range data {
			c, err := contract.DecodeChunk(d)
			if err != nil {
				b.Fatalf("apply %d: chunk %d: %v", n, i, err)
			}
			mirror[i] = c.Entries
		}
		if !h.Apply(head, assemble(mirror, n), time.Now()) || h.Len() != n {
			b.Fatalf("apply %d: the set was not applied whole (%d entries held)", n, h.Len())
		}
		ms, cms := float64(time.Since(began))/1e6, float64(selfCPU()-cpu)/1e6
		if rep == 0 || ms < res.FullMs {
			res.FullMs, res.FullCPUMs = ms, cms
		}
		if rep == 0 {
			m1 = liveHeap()
			res.HeapMiB = float64(m1-min(m0, m1)) / (1 << 20)
		}
	}
	// New versions: chunk 0 rewritten with one entry changed, the rest as mirrored.
	for rep := range 3 {
		v := uint64(2 + rep)
		changed := append([]contract.Entry(nil), mirror[0]...)
		e := changed[0]
		e.Shares = map[string]float64{scaleRegions[0]: 0.5, scaleRegions[1]: 0.25, scaleRegions[2]: 0.25 - float64(rep)*0.01}
		changed[0] = e
		raw, err := json.Marshal(contract.Chunk{LeaderRev: rev, Version: v, Index: 0, Entries: changed})
		if err != nil {
			b.Fatal(err)
		}
		head.Version = v
		head.ChunkVersions = append([]uint64(nil), head.ChunkVersions...)
		head.ChunkVersions[0] = v
		began, cpu := time.Now(), selfCPU()
		c, err := contract.DecodeChunk(raw)
		if err != nil {
			b.Fatal(err)
		}
		mirror[0] = c.Entries
		if !h.Apply(head, assemble(mirror, n), time.Now()) {
			b.Fatalf("apply %d: version %d not applied", n, v)
		}
		ms, cms := float64(time.Since(began))/1e6, float64(selfCPU()-cpu)/1e6
		if rep == 0 || ms < res.VersionMs {
			res.VersionMs, res.VersionCPUMs = ms, cms
		}
	}
	mirror = nil // the table alone: what the Holder keeps of the latest version
	m2 := liveHeap()
	res.TableMiB = float64(m2-min(base, m2)) / (1 << 20)
	runtime.KeepAlive(h)
	runtime.KeepAlive(data) // in base too: it is not the enforcer's
	return res
}

// selfCPU is the CPU this process has used (user + system, getrusage): on a shared
// machine the apply path's own cost, apart from the time it waited for a CPU.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// liveHeap is the heap in use after a collection (two: the first may leave finalizers'
// objects for the second).
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// assemble is the Watcher's: the mirrored chunks' entries in chunk order.
func assemble(mirror [][]contract.Entry, n int) []contract.Entry {
	out := make([]contract.Entry, 0, n)
	for _, es := range mirror {
		out = append(out, es...)
	}
	return out
}
