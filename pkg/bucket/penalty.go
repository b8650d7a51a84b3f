package bucket

import (
	"context"
	"fmt"
	"hash/maphash"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Penalty is a rule's penalty for abuse: an identity refused Refusals times within one
// window of Within is refused outright for Block, whatever its buckets hold ("refused
// 1,000 times in a minute → refused for 10 minutes"). A store keeps, per identity and
// penalty Name, a PenaltyState beside the buckets (in Redis in the identity's slot) and
// decides it in the same atomic step as the take; Request.Refused hands it the refusals
// a layer above answered from memory (pkg/lease's refusal cache), so an identity refused
// on many enforcers is counted across them.
//
// The window is fixed, not sliding: it starts at the first refusal counted after the
// last window ended (or after a block), and refusals are counted in the window current
// when the store hears of them. Refusals answered while the identity is blocked are not
// counted (they would otherwise renew the block for ever).
type Penalty struct {
	// Name is the penalty's key among the identity's (the rule id): at most MaxNameLen
	// bytes, not empty.
	Name string
	// Refusals is the count within one window that blocks: in [1, MaxPenaltyRefusals].
	Refusals int64
	// Within is the window's length, Block how long the identity is then refused: each
	// in [MinPenaltyTime, MaxPenaltyTime].
	Within, Block time.Duration
}

// Bounds of a Penalty.
const (
	MaxPenaltyRefusals = 1_000_000_000
	MinPenaltyTime     = time.Second
	MaxPenaltyTime     = 7 * 24 * time.Hour
)

// PenaltyState is one identity's penalty at a moment, in Unix µs: Count refusals counted
// in the window that began at Start, and refused outright until Until (0: never blocked).
// The zero State is an identity never refused.
type PenaltyState struct {
	Count int64
	Start int64
	Until int64
}

// Blocked reports whether the identity is refused outright at now.
func (s PenaltyState) Blocked(now int64) bool { return now < s.Until }

// Add counts n more refusals at now and returns the new state; when the window's count
// reaches p.Refusals the identity is blocked from now until now + Block (and the state
// keeps the count that blocked it, for explain). Refusals while blocked are not counted.
// A window older than Within, or one that began before the last block ended, is
// replaced by a new one starting at now (and the ended block forgotten, as a store that
// expired the state would). A clock that goes back (now < Start) counts in
// the current window. Pure integer arithmetic: the take script (redis.lua) does the same
// in Lua's doubles, exact below 2^53.
func (p *Penalty) Add(s PenaltyState, now, n int64) PenaltyState {
	if n <= 0 || now < s.Until {
		return s
	}
	if now-s.Start >= p.Within.Microseconds() || s.Start < s.Until {
		s = PenaltyState{Start: now} // a block that has ended is forgotten with its window
	}
	s.Count += n
	if s.Count >= p.Refusals {
		s.Until = now + p.Block.Microseconds()
	}
	return s
}

// ExpiresAt is when the state stops mattering (Unix µs): the later of the block's end and
// the window's. A store may forget it then without changing an answer.
func (p *Penalty) ExpiresAt(s PenaltyState) int64 {
	return max(s.Until, s.Start+p.Within.Microseconds())
}

func (p *Penalty) validate() error {
	switch {
	case p.Name == "":
		return fmt.Errorf("penalty: empty name")
	case len(p.Name) > MaxNameLen:
		return fmt.Errorf("penalty: name is %d bytes, more than %d", len(p.Name), MaxNameLen)
	case p.Refusals < 1 || p.Refusals > MaxPenaltyRefusals:
		return fmt.Errorf("penalty %q: refusals %d, must be in [1, %d]", p.Name, p.Refusals, MaxPenaltyRefusals)
	case p.Within < MinPenaltyTime || p.Within > MaxPenaltyTime:
		return fmt.Errorf("penalty %q: within %v, must be in [%v, %v]", p.Name, p.Within, MinPenaltyTime, MaxPenaltyTime)
	case p.Block < MinPenaltyTime || p.Block > MaxPenaltyTime:
		return fmt.Errorf("penalty %q: block %v, must be in [%v, %v]", p.Name, p.Block, MinPenaltyTime, MaxPenaltyTime)
	}
	return nil
}

// PenaltyPeeker reads an identity's penalty state without changing it: for explain,
// never for the check path.
type PenaltyPeeker interface {
	// PeekPenalty returns identity's state of penalty p (the zero state if none) and the
	// store's time now (Unix µs), the clock the state's times are on.
	PeekPenalty(ctx context.Context, identity string, p *Penalty) (st PenaltyState, now int64, err error)
}

// PeekPenalty implements PenaltyPeeker.
func (m *Memory) PeekPenalty(_ context.Context, identity string, p *Penalty) (PenaltyState, int64, error) {
	now := m.clock.Now().UnixMicro()
	s := &m.shards[maphash.String(m.seed, identity)%memoryShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.entries[identity]; e != nil {
		return e.penalty(p, now), now, nil
	}
	return PenaltyState{}, now, nil
}

// peekPenaltyScript reads the server's time and one key, writing nothing.
const peekPenaltyScript = `local t = redis.call('TIME')
return {t[1], t[2], redis.call('GET', KEYS[1])}`

// PeekPenalty implements PenaltyPeeker: one read-only script on the identity's shard.
// A value that is not the store's reads as the zero state, as in the take script.
func (r *Redis) PeekPenalty(ctx context.Context, identity string, p *Penalty) (PenaltyState, int64, error) {
	cmd := redis.NewSliceCmd(ctx, "eval", peekPenaltyScript, 1, r.PenaltyKey(identity, p.Name))
	if err := r.client.Process(ctx, cmd); err != nil {
		return PenaltyState{}, 0, fmt.Errorf("bucket: redis: while reading the penalty of identity %.64q: %w", identity, err)
	}
	v := cmd.Val()
	if len(v) < 2 {
		return PenaltyState{}, 0, fmt.Errorf("bucket: redis: unexpected penalty reply %v", v)
	}
	sec, err1 := strconv.ParseInt(fmt.Sprint(v[0]), 10, 64)
	us, err2 := strconv.ParseInt(fmt.Sprint(v[1]), 10, 64)
	if err1 != nil || err2 != nil {
		return PenaltyState{}, 0, fmt.Errorf("bucket: redis: unexpected server time %v", v[:2])
	}
	now := sec*1_000_000 + us
	var st PenaltyState
	if len(v) > 2 {
		if s, ok := v[2].(string); ok {
			var a, b, c int64
			if n, err := fmt.Sscanf(s, "%d %d %d", &a, &b, &c); err == nil && n == 3 {
				st = PenaltyState{Count: a, Start: b, Until: c}
			}
		}
	}
	return st, now, nil
}
