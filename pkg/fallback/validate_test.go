package fallback

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
)

// validNext is a bucket.ValidTaker that counts which entry the Store used.
type validNext struct {
	mem         *bucket.Memory
	take, valid atomic.Int32
}

func (v *validNext) Take(ctx context.Context, req *bucket.Request) (bucket.Result, error) {
	v.take.Add(1)
	return v.mem.Take(ctx, req)
}

func (v *validNext) TakeValid(ctx context.Context, req *bucket.Request) (bucket.Result, error) {
	v.valid.Add(1)
	return v.mem.TakeValid(ctx, req)
}

// TestValidatesOnce: the Store validates a request once and passes it to a ValidTaker's
// TakeValid; an invalid request never reaches the next store.
func TestValidatesOnce(t *testing.T) {
	clk := clock.NewFake(t0)
	next := &validNext{mem: bucket.NewMemory(clk, 100)}
	cfg := DefaultConfig()
	cfg.Clock = clk
	s, err := New(next, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if res, err := s.Take(context.Background(), req("a:k", 10, 10)); err != nil || res.Granted != 1 {
		t.Fatalf("valid request: %+v, %v", res, err)
	}
	bad := req("a:k", 10, 10)
	bad.Want = 0
	if _, err := s.Take(context.Background(), bad); !errors.Is(err, bucket.ErrInvalid) {
		t.Fatalf("want 0: %v, want ErrInvalid", err)
	}
	if tk, v := next.take.Load(), next.valid.Load(); tk != 0 || v != 1 {
		t.Fatalf("next: %d Takes, %d TakeValids; want 0 and 1", tk, v)
	}
}
