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

//go:embed inflight.lua
var inflightScript string

var inflightSHA = func() string {
	h := sha1.Sum([]byte(inflightScript))
	return hex.EncodeToString(h[:])
}()

// HeldKey returns the Redis key of identity's in-flight slots of limit name (for tests and
// operators): KeyPrefix + "{" + identity + "}#held:" + name, in the identity's slot and
// apart from its buckets (":" + name) and sightings ("#seen").
func (r *Redis) HeldKey(identity, name string) string {
	b := append([]byte(r.prefix), '{')
	b = appendEscaped(b, identity)
	b = append(b, "}#held:"...)
	return string(append(b, name...))
}

// Acquire implements InflightStore: one script call on the identity's shard (inflight.lua)
// that forgets the slots older than h.Timeout, then admits h.Handle if fewer than h.Cap
// remain. Errors as Take's: a lost reply may have admitted a slot nobody will release,
// which the timeout gives back (under, for at most the timeout).
func (r *Redis) Acquire(ctx context.Context, h *Hold) (HoldResult, error) {
	if err := h.Validate(); err != nil {
		return HoldResult{}, err
	}
	v, err := r.inflight(ctx, "acquire", h)
	if err != nil {
		return HoldResult{}, err
	}
	if v[0] != 0 && v[0] != 1 || v[1] < 0 || v[1] > MaxConcurrent || v[2] < 0 {
		return HoldResult{}, fmt.Errorf("bucket: redis: unexpected in-flight reply %v for identity %.64q", v, h.Identity)
	}
	return HoldResult{Held: v[0] == 1, InFlight: v[1], RetryAfter: time.Duration(v[2]) * time.Millisecond, Source: SourceRedis}, nil
}

// Release implements InflightStore: one script call (ZREM after forgetting expired slots).
func (r *Redis) Release(ctx context.Context, h *Hold) error {
	if err := h.ValidateRelease(true); err != nil {
		return err
	}
	return r.release(ctx, "release", h)
}

// ReleaseOldest implements InflightStore: one script call (ZPOPMIN after forgetting
// expired slots).
func (r *Redis) ReleaseOldest(ctx context.Context, h *Hold) error {
	if err := h.ValidateRelease(false); err != nil {
		return err
	}
	return r.release(ctx, "oldest", h)
}

func (r *Redis) release(ctx context.Context, op string, h *Hold) error {
	v, err := r.inflight(ctx, op, h)
	if err != nil {
		return err
	}
	if v[0] == 0 {
		return ErrUnknownHandle
	}
	return nil
}

// inflight calls the in-flight script (by SHA; the script itself once on NOSCRIPT).
func (r *Redis) inflight(ctx context.Context, op string, h *Hold) ([]int64, error) {
	var now int64
	if r.clock != nil {
		now = r.clock.Now().UnixMilli()
	}
	args := []any{"evalsha", inflightSHA, "1", r.HeldKey(h.Identity, h.Name), op, h.Handle,
		strconv.FormatInt(h.Cap, 10), strconv.FormatInt(h.Timeout.Milliseconds(), 10), strconv.FormatInt(now, 10)}
	cmd, err := evalSHA(ctx, r, inflightScript, redis.NewIntSliceCmd, args)
	if err != nil {
		if cerr := ctxEnded(ctx); cerr != nil {
			return nil, fmt.Errorf("bucket: redis: while holding in flight for identity %.64q: %w (%w)", h.Identity, cerr, err)
		}
		return nil, fmt.Errorf("bucket: redis: while holding in flight for identity %.64q: %w", h.Identity, err)
	}
	v := cmd.Val()
	if len(v) != 3 {
		return nil, fmt.Errorf("bucket: redis: unexpected in-flight reply %v for identity %.64q", v, h.Identity)
	}
	return v, nil
}
