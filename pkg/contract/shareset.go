// The share set is the wire format of the shares the quota balancer publishes in etcd
// and every enforcer watches: the contract between cmd/balancer and the enforcers.
//
// # Layout
//
// Under a prefix (default "/allot/shares/"):
//
//	<prefix>head            Head: the set in force — version, fencing token, chunk count
//	<prefix>chunk/<i>       Chunk i of that version, i in [0, Head.Chunks)
//
// A set lists only the identities whose shares differ from the default split (docs/design.md §12:
// etcd carries the busy keys, not all). Each Entry gives every region's share of one
// limited identity (rule id, identity); an identity not listed gets the default split.
//
// # Writing (the balancer)
//
// A new version is written chunk by chunk, each chunk in its own etcd transaction within
// etcd's request size limit (MaxChunkBytes), and the head last, so a reader that sees a
// head can fetch every chunk it names. Only the chunks whose entries changed are written
// (Chunker): an entry's chunk is fixed by a hash of its rule and identity, and the head
// lists the version at which each chunk was last written (Head.ChunkVersions). Every transaction is fenced: it compares the
// leader's election key's create revision (Head.LeaderRev) and fails at etcd when the
// writer is no longer the leader. The head is rewritten every interval even when nothing
// changed (Head.PublishedAt moves), so enforcers can tell a live balancer from a lost one.
//
// # Reading (an enforcer)
//
// An enforcer takes a set only when it is newer (Newer) than the one it holds: a set from
// an older leader (a lower LeaderRev) is ignored whatever its version. It reads the head,
// then each chunk, and swaps in a snapshot only when every chunk i carries the head's
// LeaderRev and Head.ChunkVersion(i); otherwise it waits for the chunks or the next head.
// A reader that predates ChunkVersions wants every chunk at Version: it waits, keeping its
// last set until that set goes stale, so upgrade the enforcers before the balancers.

package contract

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// MaxChunkBytes bounds one chunk's encoding: well under etcd's default 1.5 MiB request
// limit, leaving room for the transaction's compare and the key.
const MaxChunkBytes = 512 << 10

// ErrInvalid is wrapped by every decoding or validation error.
var ErrInvalid = errors.New("shareset: invalid")

// Head names the set in force.
type Head struct {
	// LeaderRev is the fencing token: the create revision of the publishing leader's
	// election key. A set with a lower LeaderRev is from a deposed leader.
	LeaderRev int64 `json:"leader_rev"`
	// Version increases with every new set a leader publishes (a new leader continues
	// from the persisted head's Version).
	Version uint64 `json:"version"`
	// Chunks is how many chunks the set has (0: every identity has the default split).
	Chunks int `json:"chunks"`
	// Entries is the number of entries over all chunks.
	Entries int `json:"entries"`
	// PublishedAt is when the leader last confirmed this set (rewritten every interval).
	PublishedAt time.Time `json:"published_at"`
	// Regions are the regions the set allocates between, in the balancer's order.
	Regions []string `json:"regions"`
	// Phase says whether this set is the decrease step of a change plan ("decrease": only
	// decreases applied, increases held back until the usage reports of every enforcer of
	// the regions being decreased acknowledged it) or a
	// whole target ("target"). For logs and dashboards; readers treat both alike.
	Phase string `json:"phase,omitempty"`
	// ChunkVersions, when set (one per chunk), is the Version at which each chunk was last
	// written by this leader: a version rewrites only the chunks whose entries changed
	// (Chunker). Absent, every chunk carries Version.
	ChunkVersions []uint64 `json:"chunk_versions,omitempty"`
}

// ChunkVersion is the Version chunk i of this set must carry (with LeaderRev).
func (h *Head) ChunkVersion(i int) uint64 {
	if i >= 0 && i < len(h.ChunkVersions) {
		return h.ChunkVersions[i]
	}
	return h.Version
}

// Chunk is one piece of a set.
type Chunk struct {
	LeaderRev int64   `json:"leader_rev"`
	Version   uint64  `json:"version"`
	Index     int     `json:"index"`
	Entries   []Entry `json:"entries"`
}

// Entry is the shares of one limited identity, by region. Shares are in [0, 1] and sum
// to at most 1 (plus a rounding tolerance of 1e-9).
type Entry struct {
	Rule     string             `json:"rule"`
	Identity string             `json:"identity"`
	Shares   map[string]float64 `json:"shares"`
}

// Newer reports whether (rev, ver) is newer than (haveRev, haveVer): a higher fencing
// token wins whatever the version; within one leader the higher version wins.
func Newer(rev int64, ver uint64, haveRev int64, haveVer uint64) bool {
	if rev != haveRev {
		return rev > haveRev
	}
	return ver > haveVer
}

// HeadKey and ChunkKey return the etcd keys under prefix.
func HeadKey(prefix string) string         { return prefix + "head" }
func ChunkKey(prefix string, i int) string { return prefix + "chunk/" + strconv.Itoa(i) }

// ChunkIndex parses the index out of a chunk key; ok is false for any other key.
func ChunkIndex(prefix, key string) (int, bool) {
	rest, ok := strings.CutPrefix(key, prefix+"chunk/")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	return i, err == nil && i >= 0
}

// Validate checks an entry: names set, shares finite in [0, 1], sum ≤ 1 + 1e-9.
func (e *Entry) Validate() error {
	if e.Rule == "" || e.Identity == "" {
		return fmt.Errorf("%w: entry with empty rule or identity (%q, %q)", ErrInvalid, e.Rule, e.Identity)
	}
	sum := 0.0
	for r, s := range e.Shares {
		if math.IsNaN(s) || s < 0 || s > 1 {
			return fmt.Errorf("%w: entry %s %s: region %s share %g, must be in [0, 1]", ErrInvalid, e.Rule, e.Identity, r, s)
		}
		sum += s
	}
	if sum > 1+1e-9 {
		return fmt.Errorf("%w: entry %s %s: shares sum to %g, more than 1", ErrInvalid, e.Rule, e.Identity, sum)
	}
	return nil
}

// DecodeHead parses and checks a head.
func DecodeHead(b []byte) (Head, error) {
	var h Head
	if err := json.Unmarshal(b, &h); err != nil {
		return Head{}, fmt.Errorf("%w: head: %v", ErrInvalid, err)
	}
	if h.Chunks < 0 || h.Entries < 0 || h.LeaderRev < 0 {
		return Head{}, fmt.Errorf("%w: head: negative count (chunks %d, entries %d, leader_rev %d)", ErrInvalid, h.Chunks, h.Entries, h.LeaderRev)
	}
	if len(h.ChunkVersions) != 0 && len(h.ChunkVersions) != h.Chunks {
		return Head{}, fmt.Errorf("%w: head: %d chunk_versions for %d chunks", ErrInvalid, len(h.ChunkVersions), h.Chunks)
	}
	for i, v := range h.ChunkVersions {
		if v > h.Version {
			return Head{}, fmt.Errorf("%w: head: chunk %d at version %d, after the head's %d", ErrInvalid, i, v, h.Version)
		}
	}
	return h, nil
}

// DecodeChunk parses a chunk and validates every entry.
func DecodeChunk(b []byte) (Chunk, error) {
	var c Chunk
	if err := json.Unmarshal(b, &c); err != nil {
		return Chunk{}, fmt.Errorf("%w: chunk: %v", ErrInvalid, err)
	}
	for i := range c.Entries {
		if err := c.Entries[i].Validate(); err != nil {
			return Chunk{}, fmt.Errorf("chunk %d: %w", c.Index, err)
		}
	}
	return c, nil
}

// Split cuts entries into chunks whose encodings stay under maxBytes (MaxChunkBytes when
// ≤ 0), in order. Each chunk carries rev and ver. An entry alone larger than maxBytes
// still gets a chunk of its own (the caller's bounds on identity length keep it small).
func Split(entries []Entry, rev int64, ver uint64, maxBytes int) [][]byte {
	if maxBytes <= 0 {
		maxBytes = MaxChunkBytes
	}
	var out [][]byte
	const overhead = 96 // the chunk's own fields
	start, size := 0, overhead
	flush := func(end int) {
		b, _ := json.Marshal(Chunk{LeaderRev: rev, Version: ver, Index: len(out), Entries: entries[start:end]})
		out = append(out, b)
		start, size = end, overhead
	}
	for i := range entries {
		b, _ := json.Marshal(&entries[i])
		if size+len(b)+1 > maxBytes && i > start {
			flush(i)
		}
		size += len(b) + 1
	}
	if start < len(entries) {
		flush(len(entries))
	}
	return out
}

// Members are the enforcers a leader counts for acknowledgements, by region: every one
// that may still enforce more than its default split (heard within the enforcers' Stale
// plus AckTimeout, and not deregistered by a final report). The leader writes them under
// MembersKey, fenced like the set, before the first version written after they changed,
// and with its head refresh otherwise. A new leader reads them with the set: an enforcer
// the old leader counted that is cut off from the control plane may still apply an old
// version, larger than the persisted one, which no report of the new term will show, and
// the new leader holds its region as the old one did until that enforcer reports or has
// fenced itself. An empty id stands for enforcers a leader could not name (it restored
// no readable Members): held like any other.
type Members struct {
	LeaderRev int64               `json:"leader_rev"`
	Regions   map[string][]string `json:"regions"`
}

// MaxMemberID bounds an enforcer id in Members; MaxMembers the ids in all.
const (
	MaxMemberID = 512
	MaxMembers  = 1 << 20
)

// MembersKey returns the etcd key of the persisted Members under prefix.
func MembersKey(prefix string) string { return prefix + "members" }

// DecodeMembers parses persisted Members and validates them.
func DecodeMembers(b []byte) (Members, error) {
	var m Members
	if err := json.Unmarshal(b, &m); err != nil {
		return Members{}, fmt.Errorf("%w: members: %v", ErrInvalid, err)
	}
	if m.LeaderRev < 0 {
		return Members{}, fmt.Errorf("%w: members: negative leader_rev %d", ErrInvalid, m.LeaderRev)
	}
	n := 0
	for region, ids := range m.Regions {
		if region == "" {
			return Members{}, fmt.Errorf("%w: members: an empty region name", ErrInvalid)
		}
		for _, id := range ids {
			if len(id) > MaxMemberID {
				return Members{}, fmt.Errorf("%w: members: region %q: enforcer id of %d bytes (at most %d)", ErrInvalid, region, len(id), MaxMemberID)
			}
		}
		if n += len(ids); n > MaxMembers {
			return Members{}, fmt.Errorf("%w: members: more than %d", ErrInvalid, MaxMembers)
		}
	}
	return m, nil
}
