package bucket

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed counter.lua
var counterScript string

var counterSHA = func() string {
	h := sha1.Sum([]byte(counterScript))
	return hex.EncodeToString(h[:])
}()

// CounterOp is one calendar quota counter's batch (pkg/quota): Delta added to the
// counter of (Identity, Name, Start), which is then raised to at least Floor and expires
// at ExpireAt. The store fills Total (the counter after) or Err.
type CounterOp struct {
	Identity string
	Name     string    // the quota's name, "<rule id>/<limit name>"
	Start    time.Time // the period's start: the counter's key holds it in unix seconds
	ExpireAt time.Time
	Delta    int64
	Floor    int64

	Total int64 // out: the counter after the add and the raise
	Err   error // out: this op's error; Total is unset
}

// CounterKey returns the Redis key of identity's counter for the calendar quota name
// in the period starting at start: KeyPrefix + "{" + identity + "}#q:" + name + ":" +
// unix seconds, in the identity's slot beside its buckets.
func (r *Redis) CounterKey(identity, name string, start time.Time) string {
	b := append([]byte(r.prefix), '{')
	b = appendEscaped(b, identity)
	b = append(b, "}#q:"...)
	b = append(b, name...)
	b = append(b, ':')
	return string(strconv.AppendInt(b, start.Unix(), 10))
}

// AddCounters sends every op in one pipeline (on a cluster, go-redis splits it by shard
// and sends the shards' parts concurrently): one script call per op, by SHA, the script
// itself once more for the ops a node answered NOSCRIPT. It fills each op's Total or
// Err and returns an error only when no op could be sent. A network error may leave an
// op's add done but unanswered: the next batch then adds the same counts again (the
// table keeps them pending), so a lost answer errs towards counting twice (refusing
// early), never towards losing counts.
func (r *Redis) AddCounters(ctx context.Context, ops []CounterOp) error {
	p, ok := r.client.(pipeliner)
	if !ok {
		return errNoPipeline
	}
	if len(ops) == 0 {
		return nil
	}
	cmds := make([]*redis.Cmd, len(ops))
	send := func(idx []int, bySHA bool) {
		pipe := p.Pipeline()
		for _, i := range idx {
			op := &ops[i]
			keys := []string{r.CounterKey(op.Identity, op.Name, op.Start)}
			args := []any{op.Delta, op.Floor, op.ExpireAt.UnixMilli()}
			if bySHA {
				cmds[i] = pipe.EvalSha(ctx, counterSHA, keys, args...)
			} else {
				cmds[i] = pipe.Eval(ctx, counterScript, keys, args...)
			}
		}
		_, _ = pipe.Exec(ctx) // each command carries its own error
		r.calls.Add(uint64(len(idx)))
	}
	all := make([]int, len(ops))
	for i := range all {
		all[i] = i
	}
	send(all, true)
	var again []int
	for i, c := range cmds {
		if isNoScript(c.Err()) {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		send(again, false)
	}
	failed := 0
	for i, c := range cmds {
		op := &ops[i]
		v, err := c.Int64()
		if err != nil {
			op.Err = fmt.Errorf("bucket: while adding to quota counter %q: %w", op.Name, err)
			failed++
			continue
		}
		op.Total, op.Err = v, nil
	}
	if failed == len(ops) {
		return errors.Join(ErrUnavailable, ops[0].Err)
	}
	return nil
}
