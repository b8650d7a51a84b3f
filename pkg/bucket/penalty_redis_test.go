package bucket_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/redis/go-redis/v9"
)

// TestRedisPenaltyMatchesAdd plays random takes with refusals handed over (Request.Refused)
// against Redis and checks every penalty state the script writes, bit for bit, against
// Penalty.Add evaluated in Go at the script's time (read back from the state it wrote: a
// new window's start, or a block's start), and every answer's Penalized, PenaltyCount and
// RetryAfter with it.
func TestRedisPenaltyMatchesAdd(t *testing.T) {
	n := testenv.Redis(t)
	c := n.Client()
	st := newRedis(t, c)
	ctx := context.Background()
	p := &bucket.Penalty{Name: "abuse", Refusals: 25, Within: time.Second, Block: time.Second}
	id := fmt.Sprintf("penalty:%d", time.Now().UnixNano())
	ls := []bucket.Limit{{Name: "abuse/s", Rate: 40, Burst: 2}}
	rng := rand.New(rand.NewPCG(3, 4))
	var blocks, penalized, checked, inARow int
	for i := 0; i < 100; i++ {
		if rng.IntN(4) == 0 {
			time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
		}
		refused := int64(0)
		if rng.IntN(3) == 0 {
			refused = int64(rng.IntN(6))
		}
		before := readPenalty(t, c, st.PenaltyKey(id, p.Name))
		t0 := time.Now().UnixMicro()
		res, err := st.Take(ctx, &bucket.Request{Identity: id, Limits: ls, Want: 1, Penalty: p, Refused: refused})
		t1 := time.Now().UnixMicro()
		if err != nil {
			t.Fatal(err)
		}
		after := readPenalty(t, c, st.PenaltyKey(id, p.Name))
		t2 := time.Now().UnixMicro()
		if res.Penalized {
			penalized++
			if inARow++; inARow == 5 { // then wait out the block (about 1 s, a few times)
				time.Sleep(res.RetryAfter + time.Duration(rng.IntN(3))*time.Millisecond)
			}
		} else {
			inARow = 0
		}
		// The script's time: a state it started or blocked at says it; else any time in
		// the call that keeps the same window gives the same state.
		cands := []int64{after.Start, after.Until - p.Block.Microseconds(), t0, t1}
		ok := false
		ra := res.RetryAfter.Microseconds()
		befores := []bucket.PenaltyState{before}
		if before != (bucket.PenaltyState{}) && t1 >= p.ExpiresAt(before)-2000 {
			// Redis expires the state within a ms or two of ExpiresAt: both readings.
			befores = append(befores, bucket.PenaltyState{})
		}
		for k, now := range append(cands, cands...) {
			before := befores[min(k/len(cands), len(befores)-1)]
			k %= len(cands)
			if now <= 0 {
				continue
			}
			// The retry-after of a block: exact at a time the state tells, else within the call.
			retryOK := ra == after.Until-now || (k >= 2 && ra <= after.Until-t0 && ra >= after.Until-t1)
			want, pen, count := goPenalty(p, before, now, refused, res)
			// A state Redis expired between the script and the read reads as none.
			expired := after == (bucket.PenaltyState{}) && p.ExpiresAt(want) <= t2+2000
			if (want == after || expired) && pen == res.Penalized && count == res.PenaltyCount &&
				(!pen || retryOK) {
				ok = true
				if !before.Blocked(now) && after.Blocked(now) {
					blocks++
				}
				break
			}
		}
		if !ok {
			t.Fatalf("take %d (%d handed over): Redis answered %+v and left %+v from %+v; Penalty.Add at none of %v agrees", i, refused, res, after, before, cands)
		}
		checked++
	}
	if blocks < 3 || penalized < 20 {
		t.Fatalf("%d blocks, %d penalized answers: the sequence does not exercise the penalty", blocks, penalized)
	}
	t.Logf("%d takes checked bit for bit: %d blocks began, %d answers penalized", checked, blocks, penalized)
}

// goPenalty is what the take script does to a penalty state at now (Penalty.Add step for
// step), given the answer's grant: the state left, whether penalized and the count.
func goPenalty(p *bucket.Penalty, st bucket.PenaltyState, now, refused int64, res bucket.Result) (bucket.PenaltyState, bool, int64) {
	st = p.Add(st, now, refused)
	if st.Blocked(now) {
		return st, true, st.Count
	}
	if res.Allowed() {
		return st, false, st.Count
	}
	st = p.Add(st, now, 1)
	return st, st.Blocked(now), st.Count
}

func readPenalty(t *testing.T, c *redis.Client, key string) bucket.PenaltyState {
	t.Helper()
	v, err := c.Get(context.Background(), key).Result()
	if errors.Is(err, redis.Nil) {
		return bucket.PenaltyState{}
	}
	if err != nil {
		t.Fatal(err)
	}
	var s bucket.PenaltyState
	if _, err := fmt.Sscanf(v, "%d %d %d", &s.Count, &s.Start, &s.Until); err != nil {
		t.Fatalf("penalty %q holds %q: %v", key, v, err)
	}
	return s
}
