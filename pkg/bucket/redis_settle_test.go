package bucket_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/testenv"
)

// TestRedisSettleMatchesGo plays random takes and settlements (up and down, into debt and
// back to the burst) against Redis and checks every bucket the script wrote against
// bucket.Limit.TokensAt and bucket.Limit.Settle evaluated in Go at the script's time (the
// time it stored), bit for bit, as TestRedisMatchesDecide does for takes.
func TestRedisSettleMatchesGo(t *testing.T) {
	n := testenv.Redis(t)
	c := n.Client()
	st := newRedis(t, c)
	ctx := context.Background()
	limits := []bucket.Limit{
		{Name: "a", Rate: 13.7, Burst: 50},
		{Name: "b", Rate: 0.77, Burst: 9.5},
		{Name: "c", Rate: 3.1, Burst: 20},
	}
	rng := rand.New(rand.NewPCG(3, 4))
	id := fmt.Sprintf("settle-parity:%d", time.Now().UnixNano())
	checked, debts := 0, 0
	for i := 0; i < 300; i++ {
		var ls []bucket.Limit
		for _, j := range rng.Perm(len(limits)) {
			if len(ls) == 0 || rng.IntN(2) == 0 {
				ls = append(ls, limits[j])
			}
		}
		if rng.IntN(3) == 0 {
			if _, err := st.Take(ctx, &bucket.Request{Identity: id, Limits: ls, Want: 1 + int64(rng.IntN(3)), Min: 1}); err != nil {
				t.Fatal(err)
			}
			continue
		}
		delta := int64(rng.IntN(40) - 15)
		before := readStates(t, c, st, id, ls)
		res, err := st.Settle(ctx, &bucket.Settlement{Identity: id, Limits: ls, Delta: delta})
		if err != nil {
			t.Fatal(err)
		}
		after := readStates(t, c, st, id, ls)
		if res.Delta != delta {
			t.Fatalf("settle %d: delta %d, want %d", i, res.Delta, delta)
		}
		if delta == 0 {
			continue
		}
		for j, l := range ls {
			if after[j] == (bucket.State{}) {
				continue // full again and expired before it was read back
			}
			want := l.Settle(l.TokensAt(before[j], after[j].Last), delta)
			if after[j].Tokens != want {
				t.Fatalf("settle %d of %d on %q: Redis stored %.17g, Go %.17g (before %+v, at %d)", i, delta, l.Name, after[j].Tokens, want, before[j], after[j].Last)
			}
			if want < -l.Burst || want > l.Burst {
				t.Fatalf("settle %d on %q: %.17g outside ±burst %g", i, l.Name, want, l.Burst)
			}
			if want < 0 {
				debts++
			}
			checked++
		}
		if res.Limiting < 0 || res.Limiting >= len(ls) {
			t.Fatalf("settle %d: limiting %d of %d", i, res.Limiting, len(ls))
		}
	}
	if checked < 100 || debts == 0 {
		t.Fatalf("only %d buckets checked, %d in debt: the sequence did not exercise settling", checked, debts)
	}
}
