package contract

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"testing"
)

func entriesN(n int, share float64) []Entry {
	es := make([]Entry, n)
	for i := range es {
		es[i] = Entry{Rule: "default", Identity: fmt.Sprintf("key:%05d", i),
			Shares: map[string]float64{"us-east": share, "eu-west": 1 - share}}
	}
	return es
}

// assemble reads the chunks as an enforcer does: chunk i must carry rev and versions[i].
func assemble(t *testing.T, store map[int][]byte, rev int64, versions []uint64, maxBytes int) map[string]float64 {
	t.Helper()
	got := map[string]float64{}
	for i, v := range versions {
		b, ok := store[i]
		if !ok {
			t.Fatalf("chunk %d never written", i)
		}
		if len(b) > maxBytes {
			t.Fatalf("chunk %d is %d bytes, more than %d", i, len(b), maxBytes)
		}
		c, err := DecodeChunk(b)
		if err != nil {
			t.Fatal(err)
		}
		if c.LeaderRev != rev || c.Version != v || c.Index != i {
			t.Fatalf("chunk %d carries (%d, %d, index %d), the head wants (%d, %d)", i, c.LeaderRev, c.Version, c.Index, rev, v)
		}
		for _, e := range c.Entries {
			got[e.Identity] = e.Shares["us-east"]
		}
	}
	return got
}

// A version rewrites only the chunks whose entries changed, and what the chunks hold,
// read with the head's versions, is always the whole set.
func TestChunkerWritesOnlyChangedChunks(t *testing.T) {
	const maxBytes = 4 << 10
	c := NewChunker(maxBytes)
	store := map[int][]byte{}
	apply := func(ws []ChunkWrite) {
		for _, w := range ws {
			store[w.Index] = w.Data
		}
	}
	es := entriesN(500, 0.5)
	ws, vs := c.Next(es, 7, 1)
	if len(ws) != len(vs) || len(vs) < 16 {
		t.Fatalf("first layout: %d writes for %d chunks, want every chunk (and ≥ 16 for 500 entries of 4 KiB chunks)", len(ws), len(vs))
	}
	apply(ws)
	// Nothing changed: nothing to write, every chunk keeps its version.
	ws, vs = c.Next(es, 7, 2)
	if len(ws) != 0 {
		t.Fatalf("unchanged set: %d chunk writes, want 0", len(ws))
	}
	got := assemble(t, store, 7, vs, maxBytes)
	if len(got) != 500 {
		t.Fatalf("%d entries read back, want 500", len(got))
	}
	// Three entries move, in any order: at most three chunks written.
	es2 := append([]Entry(nil), es...)
	for _, i := range []int{3, 250, 499} {
		es2[i] = Entry{Rule: "default", Identity: es[i].Identity, Shares: map[string]float64{"us-east": 0.9, "eu-west": 0.1}}
	}
	es2[0], es2[1] = es2[1], es2[0]
	ws, vs = c.Next(es2, 7, 3)
	if len(ws) == 0 || len(ws) > 3 {
		t.Fatalf("three entries changed: %d chunk writes, want 1–3", len(ws))
	}
	apply(ws)
	got = assemble(t, store, 7, vs, maxBytes)
	for i, e := range es2 {
		if got[e.Identity] != e.Shares["us-east"] {
			t.Fatalf("entry %d: read %v, want %v", i, got[e.Identity], e.Shares["us-east"])
		}
	}
	// A new leader rewrites every chunk; so does the next layout after Reset.
	if ws, vs = c.Next(es2, 8, 4); len(ws) != len(vs) {
		t.Fatalf("new leader: %d writes for %d chunks", len(ws), len(vs))
	}
	c.Reset()
	if ws, vs = c.Next(es2, 8, 5); len(ws) != len(vs) {
		t.Fatalf("after Reset: %d writes for %d chunks", len(ws), len(vs))
	}
}

// The chunk count follows the set's size (growing at once, shrinking at a quarter), and
// every chunk stays within maxBytes.
func TestChunkerCount(t *testing.T) {
	const maxBytes = 2 << 10
	c := NewChunker(maxBytes)
	store := map[int][]byte{}
	n := 0
	for ver, size := range []int{0, 1, 10, 100, 1000, 600, 100, 0} {
		es := entriesN(size, 0.3)
		ws, vs := c.Next(es, 1, uint64(ver+1))
		for _, w := range ws {
			store[w.Index] = w.Data
		}
		if size == 0 && len(vs) != 0 {
			t.Fatalf("an empty set has %d chunks", len(vs))
		}
		if got := assemble(t, store, 1, vs, maxBytes); len(got) != size {
			t.Fatalf("%d entries: %d read back", size, len(got))
		}
		if size == 600 && len(vs) != n {
			t.Fatalf("1000 → 600 entries: %d chunks, want %d kept", len(vs), n)
		}
		n = len(vs)
	}
}

// The chunks encode as Chunk (the format readers decode), entries in (rule, identity) order.
func TestChunkerFormat(t *testing.T) {
	c := NewChunker(0)
	es := []Entry{{Rule: "b", Identity: "x", Shares: map[string]float64{"r": 1}}, {Rule: "a", Identity: "y", Shares: map[string]float64{"r": 0.5}}}
	ws, vs := c.Next(es, 3, 9)
	if len(ws) != 1 || len(vs) != 1 || vs[0] != 9 {
		t.Fatalf("writes %d versions %v", len(ws), vs)
	}
	var ch Chunk
	if err := json.Unmarshal(ws[0].Data, &ch); err != nil {
		t.Fatal(err)
	}
	if ch.LeaderRev != 3 || ch.Version != 9 || len(ch.Entries) != 2 || ch.Entries[0].Rule != "a" {
		t.Fatalf("chunk %+v", ch)
	}
}

// A head's chunk_versions must name every chunk and none after the head's version.
func TestHeadChunkVersions(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{`{"version":5,"chunks":2,"chunk_versions":[3,5]}`, true},
		{`{"version":5,"chunks":2}`, true},
		{`{"version":5,"chunks":2,"chunk_versions":[5]}`, false},
		{`{"version":5,"chunks":1,"chunk_versions":[6]}`, false},
	} {
		h, err := DecodeHead([]byte(tc.in))
		if (err == nil) != tc.ok {
			t.Errorf("%s: err %v, want ok %v", tc.in, err, tc.ok)
		}
		if err == nil && h.ChunkVersion(1) != 5 && len(h.ChunkVersions) == 0 {
			t.Errorf("%s: chunk 1 version %d, want the head's", tc.in, h.ChunkVersion(1))
		}
	}
}

func BenchmarkChunkerUnchanged(b *testing.B) {
	es := entriesN(10000, 0.5)
	c := NewChunker(0)
	c.Next(es, 1, 1)
	b.ReportAllocs()
	var written int
	for i := range b.N {
		ws, _ := c.Next(es, 1, uint64(i+2))
		written += len(ws)
	}
	b.ReportMetric(float64(written)/float64(b.N), "chunks-written/op")
}

// BenchmarkChunkerTenThousand: a set of 10,000 entries in which 20 change each version
// (a busy minority moving, the tail steady): the bytes a version writes to etcd with only
// the changed chunks, beside the whole set (Split, what every version wrote before).
func BenchmarkChunkerTenThousand(b *testing.B) {
	es := entriesN(10000, 0.5)
	c := NewChunker(0)
	c.Next(es, 1, 1)
	whole := 0
	for _, ch := range Split(es, 1, 1, 0) {
		whole += len(ch)
	}
	var written, chunks int
	v := uint64(1)
	for b.Loop() {
		v++
		for j := range 20 {
			i := (int(v)*7919 + j*104729) % len(es)
			es[i].Shares = map[string]float64{"us-east": float64(v%10) / 10, "eu-west": 1 - float64(v%10)/10}
		}
		ws, _ := c.Next(es, 1, v)
		for _, w := range ws {
			written += len(w.Data)
		}
		chunks += len(ws)
	}
	n := float64(v - 1)
	b.ReportMetric(float64(written)/n, "bytes-written/version")
	b.ReportMetric(float64(whole), "bytes-whole-set/version")
	b.ReportMetric(float64(chunks)/n, "chunks-written/version")
}

// appendEntry writes what json.Marshal writes, for the entries it encodes itself and for
// those it hands to json.Marshal.
func TestAppendEntryIsMarshal(t *testing.T) {
	shares := []float64{0, 1, 0.5, 1.0 / 3, 2.0 / 3, 1e-7, 1.5e-9, 0.000001, 1e21, 123456789.125, 0.1 + 0.2, 5e-324, -0.25}
	strs := []string{"default", "key:k_123", "", "a\"b", `back\slash`, "<html>&", "tab\there", "é", "\u2028", "\xff"}
	var entries []Entry
	for i, s := range strs {
		m := map[string]float64{}
		for j := 0; j <= i%4; j++ {
			m[[]string{"us-east", "eu-west", "ap-south", s}[j]] = shares[(i+j)%len(shares)]
		}
		entries = append(entries, Entry{Rule: s, Identity: "key:" + s, Shares: m})
		entries = append(entries, Entry{Rule: "r", Identity: s, Shares: map[string]float64{"us-east": shares[i%len(shares)]}})
	}
	for _, f := range shares {
		entries = append(entries, Entry{Rule: "r", Identity: "i", Shares: map[string]float64{"z": f, "a": 1 - f}})
	}
	entries = append(entries, Entry{Rule: "r", Identity: "nil"}, Entry{Rule: "r", Identity: "empty", Shares: map[string]float64{}},
		Entry{Rule: "r", Identity: "nan", Shares: map[string]float64{"a": math.NaN()}},
		Entry{Rule: "r", Identity: "inf", Shares: map[string]float64{"a": math.Inf(1)}})
	for _, e := range entries {
		want, err := json.Marshal(&e)
		if err != nil {
			want = nil
		}
		if got := appendEntry([]byte("x"), &e); string(got) != "x"+string(want) {
			t.Errorf("%+v: %s, want x%s", e, got, want)
		}
	}
	// And a chunk of those it can encode is what json.Marshal writes for it.
	entries = slices.DeleteFunc(entries, func(e Entry) bool { _, err := json.Marshal(&e); return err != nil })
	for _, n := range []int{1, 3, len(entries)} {
		body := []byte{'['}
		for i, e := range entries[:n] {
			if i > 0 {
				body = append(body, ',')
			}
			body = appendEntry(body, &e)
		}
		body = append(body, ']')
		for _, h := range []struct {
			rev   int64
			ver   uint64
			index int
		}{{0, 0, 0}, {3, 9, 1}, {-1, math.MaxUint64, 1 << 20}, {math.MaxInt64, 1, 63}} {
			want, err := json.Marshal(rawChunk{LeaderRev: h.rev, Version: h.ver, Index: h.index, Entries: body})
			if err != nil {
				t.Fatal(err)
			}
			if got := appendChunk(nil, h.rev, h.ver, h.index, body); string(got) != string(want) {
				t.Errorf("chunk of %d entries %+v:\n%s\nwant\n%s", n, h, got, want)
			}
		}
	}
}
