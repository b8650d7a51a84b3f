package fallback

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// heldNext is a fakeNext that also holds in-flight slots (in memory), failing them with
// its shard's mode "down" like its takes.
type heldNext struct {
	*fakeNext
	mem *bucket.Memory
}

func (n *heldNext) down(identity string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	m, ok := n.modes[identity]
	if !ok {
		m = n.modes[shardOf(identity)]
	}
	return m == down
}

func (n *heldNext) Acquire(ctx context.Context, h *bucket.Hold) (bucket.HoldResult, error) {
	if n.down(h.Identity) {
		return bucket.HoldResult{}, errDown
	}
	return n.mem.Acquire(ctx, h)
}

func (n *heldNext) Release(ctx context.Context, h *bucket.Hold) error {
	if n.down(h.Identity) {
		return errDown
	}
	return n.mem.Release(ctx, h)
}

func (n *heldNext) ReleaseOldest(ctx context.Context, h *bucket.Hold) error {
	if n.down(h.Identity) {
		return errDown
	}
	return n.mem.ReleaseOldest(ctx, h)
}

func newHeldHarness(t *testing.T, edit func(*Config)) (*harness, *heldNext) {
	t.Helper()
	h := newHarness(t, edit)
	h.s.Close()
	next := &heldNext{fakeNext: h.next, mem: bucket.NewMemory(h.clk, 0)}
	s, err := New(next, h.s.cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.s = s
	t.Cleanup(func() { s.Close() })
	return h, next
}

func holdOf(identity, handle string, cap int64) *bucket.Hold {
	return &bucket.Hold{Identity: identity, Name: "r/c", Handle: handle, Cap: cap, Timeout: 30 * time.Second}
}

func acquireN(t *testing.T, s *Store, identity string, cap int64, n int) (held int, src bucket.Source) {
	t.Helper()
	for i := range n {
		r, err := s.Acquire(context.Background(), holdOf(identity, fmt.Sprint("h", i), cap))
		if err != nil {
			t.Fatalf("Acquire %d: %v", i, err)
		}
		if r.Held {
			held++
		}
		src = r.Source
	}
	return held, src
}

// While the shard answers, slots are held by the next store; while its breaker is open,
// locally at cap × Slack / N, and a fail-closed hold is refused.
func TestInflightDuringOutage(t *testing.T) {
	ctx := context.Background()
	h, next := newHeldHarness(t, func(c *Config) { c.Peers = func() int { return 4 } })
	if n, src := acquireN(t, h.s, "a:k", 10, 12); n != 10 || src != bucket.SourceMemory {
		t.Fatalf("healthy: %d held (source %v), want the next store's 10", n, src)
	}
	if got := next.mem.Held("a:k", "r/c"); got != 10 {
		t.Fatalf("next store holds %d, want 10", got)
	}
	h.trip(t, "a")
	// cap 10 × Slack 2 / 4 enforcers = 5 here.
	if n, src := acquireN(t, h.s, "a:k", 10, 8); n != 5 || src != bucket.SourceFallback {
		t.Fatalf("shard down: %d held (source %v), want 5 locally", n, src)
	}
	closed := holdOf("a:login", "x", 10)
	closed.FailClosed = true
	if r, err := h.s.Acquire(ctx, closed); !errors.Is(err, bucket.ErrUnavailable) || r.Source != bucket.SourceFailClosed || r.RetryAfter <= 0 {
		t.Fatalf("fail-closed hold while down: %+v %v, want ErrUnavailable", r, err)
	}
	// A local slot is released locally; one the shard holds cannot be reached.
	if err := h.s.Release(ctx, holdOf("a:k", "h0", 0)); err != nil {
		t.Fatalf("release of a local slot: %v", err)
	}
	if err := h.s.Release(ctx, holdOf("a:k", "h0", 0)); !errors.Is(err, bucket.ErrUnavailable) {
		t.Fatalf("release of a slot held only by the unreachable shard: %v, want ErrUnavailable", err)
	}
	if err := h.s.ReleaseOldest(ctx, holdOf("a:k", "", 0)); err != nil {
		t.Fatalf("ReleaseOldest locally: %v", err)
	}
	// Another shard is unaffected.
	if n, src := acquireN(t, h.s, "b:k", 2, 3); n != 2 || src != bucket.SourceMemory {
		t.Fatalf("other shard: %d held (source %v)", n, src)
	}
}

// A failed call with the breaker still closed is answered locally, and the release finds
// the slot where it was held.
func TestInflightCallErrorHeldLocally(t *testing.T) {
	ctx := context.Background()
	h, _ := newHeldHarness(t, nil)
	h.next.set("a:k", down)
	r, err := h.s.Acquire(ctx, holdOf("a:k", "h", 3))
	if err != nil || !r.Held || r.Source != bucket.SourceFallback {
		t.Fatalf("acquire with the call failing: %+v %v, want held locally", r, err)
	}
	if st := h.s.State("a"); st != Closed {
		t.Fatalf("breaker %v after an in-flight error, want closed (only takes move it)", st)
	}
	h.next.set("a:k", healthy)
	if err := h.s.Release(ctx, holdOf("a:k", "h", 0)); err != nil {
		t.Fatalf("release of the local slot with the shard back: %v", err)
	}
	if err := h.s.Release(ctx, holdOf("a:k", "h", 0)); !errors.Is(err, bucket.ErrUnknownHandle) {
		t.Fatalf("second release: %v, want ErrUnknownHandle", err)
	}
}

func TestLocalCap(t *testing.T) {
	for _, tc := range []struct {
		cap  int64
		f    float64
		want int64
	}{{20, 2.0 / 10, 4}, {10, 2.0 / 4, 5}, {1, 2.0 / 100, 1}, {3, 2.0 / 4, 1}, {0, 2, 0}, {10, 2.0 / 3, 6}, {bucket.MaxConcurrent, 2, bucket.MaxConcurrent}} {
		if got := localCap(tc.cap, tc.f); got != tc.want {
			t.Errorf("localCap(%d, %g) = %d, want %d", tc.cap, tc.f, got, tc.want)
		}
	}
}
