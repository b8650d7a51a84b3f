package bucket

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

//go:embed settle.lua
var settleScript string

var settleSHA = func() string {
	h := sha1.Sum([]byte(settleScript))
	return hex.EncodeToString(h[:])
}()

// MarkKey returns the Redis key of identity's settlement marker id (for tests and
// operators): KeyPrefix + "{" + identity + "}#settle:" + id, in the identity's slot and
// apart from its buckets (":"), sightings ("#seen") and in-flight slots ("#held:").
func (r *Redis) MarkKey(identity, id string) string {
	b := append([]byte(r.prefix), '{')
	b = appendEscaped(b, identity)
	b = append(b, "}#settle:"...)
	return string(append(b, id...))
}

// Mark implements Settler: one SET NX PX of "<estimate> <cost>" on the identity's shard.
func (r *Redis) Mark(ctx context.Context, m *Mark) error {
	if err := m.Validate(); err != nil {
		return err
	}
	r.calls.Add(1)
	cmd := redis.NewStatusCmd(ctx, "set", r.MarkKey(m.Identity, m.ID),
		strconv.FormatInt(m.Estimate, 10)+" "+strconv.FormatInt(m.Cost, 10),
		"px", strconv.FormatInt(max(m.TTL.Milliseconds(), 1), 10), "nx")
	if err := r.client.Process(ctx, cmd); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("bucket: redis: while marking a settlement for identity %.64q: %w", m.Identity, err)
	}
	return nil
}

// Settle implements Settler: one script call on the identity's shard (settle.lua) that
// deletes the marker, refusing when it is not there, and adjusts every bucket. Errors as
// Take's; a lost reply may have settled (the marker is gone: a retry is ErrNotMarked).
func (r *Redis) Settle(ctx context.Context, s *Settlement) (Settled, error) {
	if err := s.Validate(); err != nil {
		return Settled{}, err
	}
	n := len(s.Limits)
	keys := n
	mode, amount := "d", s.Delta
	if s.ID != "" {
		keys, mode, amount = n+1, "m", s.Actual
	}
	args := make([]any, 0, 3+keys+2+2*n)
	args = append(args, "evalsha", settleSHA, strconv.Itoa(keys))
	for _, l := range s.Limits {
		args = append(args, r.Key(s.Identity, l.Name))
	}
	if s.ID != "" {
		args = append(args, r.MarkKey(s.Identity, s.ID))
	}
	args = append(args, mode, strconv.FormatInt(amount, 10))
	for _, l := range s.Limits {
		args = append(args, strconv.FormatFloat(l.Rate, 'g', -1, 64), strconv.FormatFloat(l.Burst, 'g', -1, 64))
	}
	cmd, err := evalSHA(ctx, r, settleScript, redis.NewIntSliceCmd, args) // settles once
	if err != nil {
		if cerr := ctxEnded(ctx); cerr != nil && !errors.Is(err, cerr) {
			return Settled{}, fmt.Errorf("bucket: redis: while settling for identity %.64q: %w (%w)", s.Identity, cerr, err)
		}
		return Settled{}, fmt.Errorf("bucket: redis: while settling for identity %.64q: %w", s.Identity, err)
	}
	v := cmd.Val()
	if len(v) != 4 || v[0] != 0 && v[0] != 1 || v[2] < 0 || v[2] >= int64(n) {
		return Settled{}, fmt.Errorf("bucket: redis: unexpected settle reply %v for identity %.64q", v, s.Identity)
	}
	if v[0] == 0 {
		return Settled{}, ErrNotMarked
	}
	return Settled{Delta: v[1], Limiting: int(v[2]), Remaining: v[3], Source: SourceRedis}, nil
}
