package bucket

import (
	"cmp"
	"context"
	"crypto/sha1"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Fences is a store that keeps the marks of a region's fenced enforcers: an enforcer whose
// shares went stale (the balancer has not accepted its reports for the staleness period:
// it is cut off from the control plane), that fenced itself sooner because its
// region-mates are heard while it is not, or that has not loaded its first set, marks
// itself at every report it tries to send (pkg/enforcer/node), and every enforcer of the
// region counts the marks in the reports it sends and lists the newest of them with the
// seq each was made with. The balancer learns from them that an enforcer it has stopped
// hearing still serves from this region's store and enforces at most its default share,
// keeps the region's default share reserved for it, and stops waiting for its
// acknowledgements once one of its marks names the last report it accepted of it
// (pkg/balancer: acks); a crashed enforcer stops marking, and its mark is forgotten after
// ttl.
//
// Each call also records when the balancer last accepted a report of the caller, and
// answers how long ago that was for the latest of the others: an enforcer that is not
// heard while its region-mates are is cut off alone, and fences itself without waiting
// for the staleness period (a balancer that hears nobody is not a reason to).
//
// Only ids, seqs and times are kept, one entry per enforcer in each set, at most MaxFences:
// a region's enforcers are few and name themselves; nothing a client sends reaches it.
type Fences interface {
	// Fence marks c.ID fenced now with c.Seq, or with c.Fenced false takes its mark back,
	// records its heard time (c.ID "" does none of it), and returns the marks within
	// c.TTL and the latest other heard time within 2 × c.TTL (behind a report aggregator
	// the balancer confirms a report up to two intervals after it was sent, so a heard
	// time is that old when recorded). c.TTL in [MinFenceTTL, MaxFenceTTL]; c.ID at most
	// MaxSightLen bytes.
	Fence(ctx context.Context, c FenceCall) (FenceReply, error)
}

// FenceCall is one enforcer's Fence call.
type FenceCall struct {
	ID     string // the calling enforcer's id (SightID of its name); "": only read
	Fenced bool   // mark it fenced (with Seq), or take its mark back
	// Seq is the seq of the last report it had sent when it fenced itself (0: none), kept
	// with its mark: the balancer believes a mark of an enforcer it has stopped hearing only
	// if it took no report of it later than that (pkg/enforcer/node.fence).
	Seq uint64
	// HeardAgo is how long ago the balancer last accepted a report of it; negative: never
	// (nothing is recorded).
	HeardAgo time.Duration
	TTL      time.Duration
}

// FenceReply is what a Fence call reads.
type FenceReply struct {
	Marked int         // the ids marked within the window (at most MaxFences)
	Marks  []FenceMark // the newest of them, at most MaxFenceMarks
	// MateHeardAgo is how long ago the balancer accepted the latest report of another id
	// within the window, as that id recorded it; negative: none.
	MateHeardAgo time.Duration
}

// FenceMark is one enforcer's mark: its id and the seq it marked itself with.
type FenceMark struct {
	ID  string
	Seq uint64
}

// The bounds of a Fence call.
const (
	MaxFences     = 4096
	MaxFenceMarks = 64
	MinFenceTTL   = time.Millisecond
	MaxFenceTTL   = time.Hour
)

// SightID is the id an enforcer named name goes by in its region's store (sightings,
// fences): name itself, or a hash of a name longer than MaxSightLen.
func SightID(name string) string {
	if len(name) <= MaxSightLen {
		return name
	}
	h := sha256.Sum256([]byte(name))
	return hex.EncodeToString(h[:16])
}

func validateFence(c FenceCall) error {
	switch {
	case len(c.ID) > MaxSightLen:
		return fmt.Errorf("%w: fence id is %d bytes, more than %d", ErrInvalid, len(c.ID), MaxSightLen)
	case c.TTL < MinFenceTTL || c.TTL > MaxFenceTTL:
		return fmt.Errorf("%w: fence ttl %v, must be in [%v, %v]", ErrInvalid, c.TTL, MinFenceTTL, MaxFenceTTL)
	}
	return nil
}

//go:embed fence.lua
var fenceScript string

var fenceSHA = func() string {
	h := sha1.Sum([]byte(fenceScript))
	return hex.EncodeToString(h[:])
}()

// FenceKey returns the Redis key of the fenced enforcers' marks (for tests and operators):
// KeyPrefix + "{fenced}#marks"; their seqs and the heard times are KeyPrefix +
// "{fenced}#seqs" and "{fenced}#heard". Identities' keys all end their hash tag at the
// escaped identity followed by "}:" or "}#" with a suffix of their own, so no identity's
// key is one of these; they live in one slot of the cluster.
func (r *Redis) FenceKey() string { return r.prefix + "{fenced}#marks" }

// Fence implements Fences: one script call (fence.lua) on the marks' shard.
func (r *Redis) Fence(ctx context.Context, c FenceCall) (FenceReply, error) {
	if err := validateFence(c); err != nil {
		return FenceReply{}, err
	}
	var now int64
	if r.clock != nil {
		now = r.clock.Now().UnixMilli()
	}
	flag := "0"
	if c.Fenced {
		flag = "1"
	}
	heard := int64(-1)
	if c.HeardAgo >= 0 {
		heard = c.HeardAgo.Milliseconds()
	}
	args := []any{"evalsha", fenceSHA, "3", r.FenceKey(), r.prefix + "{fenced}#seqs", r.prefix + "{fenced}#heard",
		c.ID, flag, strconv.FormatInt(max(c.TTL.Milliseconds(), 1), 10), strconv.Itoa(MaxFences),
		strconv.FormatInt(now, 10), strconv.FormatUint(c.Seq, 10), strconv.FormatInt(heard, 10),
		strconv.Itoa(MaxFenceMarks)}
	cmd, err := evalSHA(ctx, r, fenceScript, redis.NewSliceCmd, args)
	if err != nil {
		if cerr := ctxEnded(ctx); cerr != nil {
			return FenceReply{}, fmt.Errorf("bucket: redis: while marking fenced enforcers: %w (%w)", cerr, err)
		}
		return FenceReply{}, fmt.Errorf("bucket: redis: while marking fenced enforcers: %w", err)
	}
	return fenceReply(cmd.Val())
}

// fenceReply reads fence.lua's reply.
func fenceReply(v []any) (FenceReply, error) {
	bad := func(what string) (FenceReply, error) {
		return FenceReply{}, fmt.Errorf("bucket: redis: unexpected fence reply (%s): %.200v", what, v)
	}
	if len(v) < 2 || len(v)%2 != 0 {
		return bad("length")
	}
	n, ok1 := v[0].(int64)
	mate, ok2 := v[1].(int64)
	if !ok1 || !ok2 || n < 0 || n > MaxFences || mate < -1 {
		return bad("counts")
	}
	rep := FenceReply{Marked: int(n), MateHeardAgo: -1}
	if mate >= 0 {
		rep.MateHeardAgo = time.Duration(mate) * time.Millisecond
	}
	if len(v)/2-1 > MaxFenceMarks {
		return bad("marks")
	}
	for i := 2; i < len(v); i += 2 {
		id, ok := v[i].(string)
		ss, ok2 := v[i+1].(string)
		seq, err := strconv.ParseUint(ss, 10, 64)
		if !ok || !ok2 || err != nil || len(id) > MaxSightLen {
			return bad("mark")
		}
		rep.Marks = append(rep.Marks, FenceMark{ID: id, Seq: seq})
	}
	return rep, nil
}

// Fence implements Fences on the store's clock: the same step as fence.lua.
func (m *Memory) Fence(_ context.Context, c FenceCall) (FenceReply, error) {
	if err := validateFence(c); err != nil {
		return FenceReply{}, err
	}
	now := m.clock.Now().UnixMilli()
	f := &m.fences
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.at == nil {
		f.at, f.seq, f.heard = map[string]int64{}, map[string]uint64{}, map[string]int64{}
	}
	w := max(c.TTL.Milliseconds(), 1)
	for k, at := range f.at {
		if at <= now-w {
			delete(f.at, k)
			delete(f.seq, k)
		}
	}
	for k, at := range f.heard {
		if at <= now-2*w {
			delete(f.heard, k)
		}
	}
	if c.ID != "" && !c.Fenced {
		delete(f.at, c.ID)
		delete(f.seq, c.ID)
	} else if c.ID != "" {
		f.at[c.ID], f.seq[c.ID] = now, c.Seq
		keepNewest(f.at, func(k string) { delete(f.seq, k) })
	}
	if ago := c.HeardAgo.Milliseconds(); c.ID != "" && c.HeardAgo >= 0 && ago < 2*w {
		f.heard[c.ID] = now - ago
		keepNewest(f.heard, nil)
	}
	rep := FenceReply{Marked: len(f.at), MateHeardAgo: -1}
	var mateAt int64
	for k, at := range f.heard {
		if k != c.ID && (rep.MateHeardAgo < 0 || at > mateAt) {
			mateAt, rep.MateHeardAgo = at, 0
		}
	}
	if rep.MateHeardAgo == 0 {
		rep.MateHeardAgo = time.Duration(max(now-mateAt, 0)) * time.Millisecond
	}
	for k := range f.at {
		rep.Marks = append(rep.Marks, FenceMark{ID: k, Seq: f.seq[k]})
	}
	// The newest first, as ZREVRANGE lists them (ties by id, descending), then the first
	// MaxFenceMarks.
	slices.SortFunc(rep.Marks, func(a, b FenceMark) int {
		return cmp.Or(cmp.Compare(f.at[b.ID], f.at[a.ID]), cmp.Compare(b.ID, a.ID))
	})
	if len(rep.Marks) > MaxFenceMarks {
		rep.Marks = rep.Marks[:MaxFenceMarks]
	}
	if len(rep.Marks) == 0 {
		rep.Marks = nil
	}
	return rep, nil
}

// keepNewest drops the oldest entries of at past MaxFences, telling gone of each.
func keepNewest(at map[string]int64, gone func(string)) {
	for len(at) > MaxFences {
		oldest, first := "", true
		for k, t := range at {
			if first || t < at[oldest] || t == at[oldest] && k < oldest {
				oldest, first = k, false
			}
		}
		delete(at, oldest)
		if gone != nil {
			gone(oldest)
		}
	}
}

var (
	_ Fences = (*Redis)(nil)
	_ Fences = (*Memory)(nil)
)
