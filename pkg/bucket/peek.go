package bucket

import (
	"context"
	"fmt"
	"hash/maphash"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Peeker reads buckets without taking from them: for tools that explain a decision
// ("why was I limited?"), never for the check path.
type Peeker interface {
	// Peek appends to dst the tokens each bucket of identity under limits holds now (the
	// limit's burst for one never seen or full again) and returns the extended slice. It
	// writes nothing, so it never changes an answer.
	Peek(ctx context.Context, identity string, limits []Limit, dst []float64) ([]float64, error)
}

// Peek implements Peeker: the tokens TakeAt would start from, under the shard's lock.
func (m *Memory) Peek(_ context.Context, identity string, limits []Limit, dst []float64) ([]float64, error) {
	now := m.clock.Now().UnixMicro()
	s := &m.shards[maphash.String(m.seed, identity)%memoryShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[identity]
	for _, l := range limits {
		var st State
		if e != nil && now < e.fullAt {
			st = e.find(l.Name, now)
		}
		dst = append(dst, l.TokensAt(st, now))
	}
	return dst, nil
}

// peekScript reads the server's time and the buckets, and writes nothing: the take
// script's first half. Reply {seconds, µs, value or false for each key}.
const peekScript = `local t = redis.call('TIME')
local out = {t[1], t[2]}
local vals = redis.call('MGET', unpack(KEYS))
for i = 1, #KEYS do out[i + 2] = vals[i] end
return out`

// Peek implements Peeker: one read-only script on the identity's shard (the server's
// clock, as the take script), then the take script's refill in Go — bucket.TokensAt,
// the same operations — on what it read. A value that is not the store's reads as full,
// as in the take script.
func (r *Redis) Peek(ctx context.Context, identity string, limits []Limit, dst []float64) ([]float64, error) {
	if len(limits) == 0 {
		return dst, nil
	}
	args := make([]any, 0, 3+len(limits))
	args = append(args, "eval", peekScript, len(limits))
	for _, l := range limits {
		args = append(args, r.Key(identity, l.Name))
	}
	cmd := redis.NewSliceCmd(ctx, args...)
	if err := r.client.Process(ctx, cmd); err != nil {
		return dst, fmt.Errorf("bucket: while peeking at %.64q: %w", identity, err)
	}
	vals := cmd.Val()
	if len(vals) < 2 {
		return dst, fmt.Errorf("bucket: peek: reply of %d values", len(vals))
	}
	sec, err1 := strconv.ParseInt(fmt.Sprint(vals[0]), 10, 64)
	usec, err2 := strconv.ParseInt(fmt.Sprint(vals[1]), 10, 64)
	if err1 != nil || err2 != nil {
		return dst, fmt.Errorf("bucket: peek: bad TIME reply %v %v", vals[0], vals[1])
	}
	now := sec*1_000_000 + usec
	for i, l := range limits {
		var st State
		if i+2 < len(vals) {
			if v, ok := vals[i+2].(string); ok {
				st = parseBucket(v)
			}
		}
		dst = append(dst, l.TokensAt(st, now))
	}
	return dst, nil
}

// parseBucket reads "<tokens> <last µs>"; anything else is a full bucket (the zero State).
func parseBucket(v string) State {
	tok, last, ok := strings.Cut(v, " ")
	if !ok {
		return State{}
	}
	t, err1 := strconv.ParseFloat(tok, 64)
	l, err2 := strconv.ParseInt(last, 10, 64)
	if err1 != nil || err2 != nil {
		return State{}
	}
	return State{Tokens: t, Last: l}
}
