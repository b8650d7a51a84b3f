package bucket

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Fences is a store that keeps the marks of a region's fenced enforcers: an enforcer whose
// shares went stale (the balancer has not accepted its reports for the staleness period:
// it is cut off from the control plane), or that has not loaded its first set, marks
// itself at every report it tries to send (pkg/enforcer/node), and
// every enforcer of the region counts the marks in the reports it sends. The balancer
// learns from them that an enforcer it has stopped hearing still serves from this region's
// store, and keeps the region's default share reserved for it (pkg/balancer: acks); a
// crashed enforcer stops marking, and its mark is forgotten after ttl.
//
// Only ids and times are kept, one entry per enforcer, at most MaxFences: a region's
// enforcers are few and name themselves; nothing a client sends reaches it.
type Fences interface {
	// Fence marks id fenced now, or with fenced false takes id's mark back (id "" does
	// neither), and returns how many distinct ids are marked within ttl, id included.
	// ttl in [MinFenceTTL, MaxFenceTTL]; id at most MaxSightLen bytes.
	Fence(ctx context.Context, id string, fenced bool, ttl time.Duration) (int, error)
}

// The bounds of a Fence call.
const (
	MaxFences   = 4096
	MinFenceTTL = time.Millisecond
	MaxFenceTTL = time.Hour
)

func validateFence(id string, ttl time.Duration) error {
	switch {
	case len(id) > MaxSightLen:
		return fmt.Errorf("%w: fence id is %d bytes, more than %d", ErrInvalid, len(id), MaxSightLen)
	case ttl < MinFenceTTL || ttl > MaxFenceTTL:
		return fmt.Errorf("%w: fence ttl %v, must be in [%v, %v]", ErrInvalid, ttl, MinFenceTTL, MaxFenceTTL)
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
// KeyPrefix + "{fenced}#marks". Identities' keys all end their hash tag at the escaped
// identity followed by "}:" or "}#" with a suffix of their own, so no identity's key is
// this one; it lives in one slot of the cluster.
func (r *Redis) FenceKey() string { return r.prefix + "{fenced}#marks" }

// Fence implements Fences: one script call (fence.lua) on the marks' shard.
func (r *Redis) Fence(ctx context.Context, id string, fenced bool, ttl time.Duration) (int, error) {
	if err := validateFence(id, ttl); err != nil {
		return 0, err
	}
	var now int64
	if r.clock != nil {
		now = r.clock.Now().UnixMilli()
	}
	flag := "0"
	if fenced {
		flag = "1"
	}
	args := []any{"evalsha", fenceSHA, "1", r.FenceKey(), id, flag, strconv.FormatInt(max(ttl.Milliseconds(), 1), 10),
		strconv.Itoa(MaxFences), strconv.FormatInt(now, 10)}
	cmd, err := evalSHA(ctx, r, fenceScript, redis.NewIntCmd, args)
	if err != nil {
		if cerr := ctxEnded(ctx); cerr != nil {
			return 0, fmt.Errorf("bucket: redis: while marking fenced enforcers: %w (%w)", cerr, err)
		}
		return 0, fmt.Errorf("bucket: redis: while marking fenced enforcers: %w", err)
	}
	n := cmd.Val()
	if n < 0 || n > MaxFences {
		return 0, fmt.Errorf("bucket: redis: unexpected fence reply %d", n)
	}
	return int(n), nil
}

// Fence implements Fences on the store's clock: the same step as fence.lua.
func (m *Memory) Fence(_ context.Context, id string, fenced bool, ttl time.Duration) (int, error) {
	if err := validateFence(id, ttl); err != nil {
		return 0, err
	}
	now := m.clock.Now().UnixMilli()
	m.fences.mu.Lock()
	defer m.fences.mu.Unlock()
	if m.fences.at == nil {
		m.fences.at = map[string]int64{}
	}
	w := max(ttl.Milliseconds(), 1)
	for k, at := range m.fences.at {
		if at <= now-w {
			delete(m.fences.at, k)
		}
	}
	if id != "" && !fenced {
		delete(m.fences.at, id)
	} else if id != "" {
		m.fences.at[id] = now
		for len(m.fences.at) > MaxFences {
			oldest, first := "", true
			for k, at := range m.fences.at {
				if first || at < m.fences.at[oldest] {
					oldest, first = k, false
				}
			}
			delete(m.fences.at, oldest)
		}
	}
	return len(m.fences.at), nil
}

var (
	_ Fences = (*Redis)(nil)
	_ Fences = (*Memory)(nil)
)
