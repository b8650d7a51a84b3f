package contract

import (
	"bytes"
	"cmp"
	"encoding/json"
	"hash/fnv"
	"math"
	"math/bits"
	"slices"
	"strconv"
)

// Chunker lays one leader's successive sets out in chunks so that a new version rewrites
// only the chunks whose entries changed (issue 21 §3: a version rewrote every chunk, 20 MB
// for a set of 50,000 entries, however few of them moved).
//
// An entry's chunk is a hash of its rule and identity modulo a power-of-two chunk count,
// and a chunk's entries are in (rule, identity) order, so an unchanged chunk encodes to
// the same bytes. The count is the least power of two that keeps every chunk within
// maxBytes with room to spare (half of it on average); it changes only when the set
// outgrows it or shrinks to a quarter of it, and then every chunk is written, as on the
// first layout, after Reset, and when the leader (rev) changes.
//
// The zero value is not usable: call NewChunker. Not safe for concurrent use.
type Chunker struct {
	maxBytes int
	rev      int64
	fresh    bool     // the next layout writes every chunk
	bodies   [][]byte // each chunk's entries as last laid out (the JSON array)
	versions []uint64 // each chunk's version as last laid out
}

// ChunkWrite is one chunk to write: its index and its encoding (a Chunk).
type ChunkWrite struct {
	Index int
	Data  []byte
}

// NewChunker returns a Chunker for chunks of at most maxBytes (MaxChunkBytes when ≤ 0).
func NewChunker(maxBytes int) *Chunker {
	if maxBytes <= 0 {
		maxBytes = MaxChunkBytes
	}
	return &Chunker{maxBytes: maxBytes, fresh: true}
}

// Reset makes the next layout write every chunk: call it when a write failed, so what is
// in etcd is not known.
func (c *Chunker) Reset() { c.fresh = true }

// Next lays entries out as version ver of leader rev. It returns the chunks to write and
// every chunk's version for Head.ChunkVersions (len(versions) is Head.Chunks). An entry
// alone larger than maxBytes still gets a chunk (the caller's bounds on identity length
// keep entries small).
func (c *Chunker) Next(entries []Entry, rev int64, ver uint64) (writes []ChunkWrite, versions []uint64) {
	enc := make([][]byte, len(entries))
	total := 0
	ends := make([]int, len(entries))
	buf := make([]byte, 0, 96*len(entries))
	for i := range entries {
		buf = appendEntry(buf, &entries[i])
		ends[i] = len(buf)
	}
	from := 0
	for i, end := range ends {
		enc[i] = buf[from:end:end]
		total += len(enc[i]) + 1
		from = end
	}
	const overhead = 96 // a chunk's own fields
	target := min(c.maxBytes/2, TargetChunkBytes)
	fresh := c.fresh || rev != c.rev
	n := len(c.bodies)
	need := 0
	if len(entries) > 0 {
		need = pow2((total + target - 1) / target)
	}
	if fresh || need > n || need*4 <= n {
		n = need
	}
	order := make([]int, len(entries))
	for i := range order {
		order[i] = i
	}
	byKey := func(a, b Entry) int {
		return cmp.Or(cmp.Compare(a.Rule, b.Rule), cmp.Compare(a.Identity, b.Identity))
	}
	if !slices.IsSortedFunc(entries, byKey) { // the balancer's are: one pass, not a sort
		slices.SortFunc(order, func(a, b int) int { return byKey(entries[a], entries[b]) })
	}
	var groups [][]int
	for {
		groups = make([][]int, n)
		size := make([]int, n)
		over := false
		for _, i := range order {
			g := bucket(entries[i], n)
			groups[g] = append(groups[g], i)
			size[g] += len(enc[i]) + 1
			over = over || (size[g]+overhead > c.maxBytes && len(groups[g]) > 1)
		}
		if !over || n >= len(entries) {
			break
		}
		n *= 2 // a skewed hash: spread further
	}
	if n != len(c.bodies) {
		fresh = true
	}
	bodies := make([][]byte, n)
	versions = make([]uint64, n)
	for g := range groups {
		var b bytes.Buffer
		b.WriteByte('[')
		for j, i := range groups[g] {
			if j > 0 {
				b.WriteByte(',')
			}
			b.Write(enc[i])
		}
		b.WriteByte(']')
		bodies[g] = b.Bytes()
		if !fresh && bytes.Equal(bodies[g], c.bodies[g]) {
			versions[g] = c.versions[g]
			continue
		}
		versions[g] = ver
		writes = append(writes, ChunkWrite{Index: g, Data: appendChunk(nil, rev, ver, g, bodies[g])})
	}
	c.rev, c.fresh, c.bodies, c.versions = rev, false, bodies, slices.Clone(versions)
	return writes, versions
}

// rawChunk encodes as a Chunk with its entries already encoded.
type rawChunk struct {
	LeaderRev int64           `json:"leader_rev"`
	Version   uint64          `json:"version"`
	Index     int             `json:"index"`
	Entries   json.RawMessage `json:"entries"`
}

// appendChunk writes what json.Marshal writes for rawChunk{rev, ver, index, body}, body
// being a JSON array this file encoded (compact, and with <, > and & only escaped, as
// appendEntry and json.Marshal leave them): json.Marshal validated and compacted the
// body again, a third of a leader's time laying out a 10,000-entry set.
func appendChunk(b []byte, rev int64, ver uint64, index int, body []byte) []byte {
	if b == nil {
		b = make([]byte, 0, len(body)+64)
	}
	b = append(b, `{"leader_rev":`...)
	b = strconv.AppendInt(b, rev, 10)
	b = append(b, `,"version":`...)
	b = strconv.AppendUint(b, ver, 10)
	b = append(b, `,"index":`...)
	b = strconv.AppendInt(b, int64(index), 10)
	b = append(b, `,"entries":`...)
	b = append(b, body...)
	return append(b, '}')
}

// bucket is e's chunk among n (a power of two).
func bucket(e Entry, n int) int {
	h := fnv.New64a()
	h.Write([]byte(e.Rule))
	h.Write([]byte{0})
	h.Write([]byte(e.Identity))
	return int(h.Sum64() & uint64(n-1))
}

// pow2 is the least power of two ≥ max(n, 1).
func pow2(n int) int {
	if n <= 1 {
		return 1
	}
	return 1 << bits.Len(uint(n-1))
}

// TargetChunkBytes is the size a chunk is laid out for on average (at most half of
// maxBytes): small enough that a version rewrites little more than what changed, large
// enough that a whole set of the balancer's 50,000 entries at most is a few hundred etcd
// transactions. BenchmarkChunkerTenThousand: 20 of 10,000 entries changed, 0.20 MB written
// a version instead of 0.81 (0.11 at 8 KiB, 0.34 at 32 KiB).
const TargetChunkBytes = 16 << 10

// appendEntry appends e as json.Marshal encodes it. An entry of plain strings (printable
// ASCII that JSON and its HTML escaping leave alone) and finite shares, which is every
// entry the balancer writes, is encoded here: json.Marshal's reflection over the shares
// map was most of a version's layout (a tenth of the balancer's share of a 10,000-key
// regionsim run). Any other goes through json.Marshal (nothing, for a share it refuses).
func appendEntry(b []byte, e *Entry) []byte {
	if !plainJSON(e.Rule) || !plainJSON(e.Identity) || e.Shares == nil {
		return appendMarshal(b, e)
	}
	var keys [8]string
	ks := keys[:0]
	for r, v := range e.Shares {
		if !plainJSON(r) || math.IsNaN(v) || math.IsInf(v, 0) {
			return appendMarshal(b, e)
		}
		ks = append(ks, r)
	}
	slices.Sort(ks)
	b = append(b, `{"rule":"`...)
	b = append(b, e.Rule...)
	b = append(b, `","identity":"`...)
	b = append(b, e.Identity...)
	b = append(b, `","shares":{`...)
	for i, r := range ks {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, r...)
		b = append(b, `":`...)
		b = appendJSONFloat(b, e.Shares[r])
	}
	return append(b, "}}"...)
}

func appendMarshal(b []byte, e *Entry) []byte {
	j, err := json.Marshal(e)
	if err != nil {
		return b
	}
	return append(b, j...)
}

// plainJSON: s is printable ASCII that encoding/json writes as it is (no quote,
// backslash or HTML-escaped <, >, &).
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// appendJSONFloat appends a finite f as encoding/json writes a float64.
func appendJSONFloat(b []byte, f float64) []byte {
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' { // e-09 → e-9, as encoding/json
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}
