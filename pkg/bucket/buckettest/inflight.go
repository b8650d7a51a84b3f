package buckettest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
)

// InflightHarness describes an in-flight store under test.
type InflightHarness struct {
	// New returns the store for one subtest (it may return the same store every time).
	New func(t *testing.T) bucket.InflightStore
	// Clock is the fake clock the store's in-flight steps read (for Redis,
	// bucket.RedisOptions.Clock): timeouts are checked exactly and nothing sleeps.
	Clock *clock.Fake
	// Source, when not SourceNone, is the Source every acquire must carry.
	Source bucket.Source
	// Calls, when set, counts what the store sends to its backend: invalid holds send
	// nothing.
	Calls func() uint64
	// HeldKey, when set, is the Redis key of an identity's slots, for the checks of
	// placement (the identity's hash tag) and expiry; Redis reaches it.
	HeldKey func(identity, name string) string
	Redis   *RedisBackend
}

// RunInflight runs the in-flight checks as subtests of t.
func RunInflight(t *testing.T, h InflightHarness) {
	if h.New == nil || h.Clock == nil {
		t.Fatal("buckettest: InflightHarness.New and Clock are required")
	}
	s := &holdSuite{h: &h, run: time.Now().UnixNano()}
	t.Run("CapAdmitsNThenRefuses", s.capN)
	t.Run("ReleaseFreesOnce", s.releaseOnce)
	t.Run("LostReleaseHealsAfterTimeout", s.heals)
	t.Run("RetriedAcquireHoldsOneSlot", s.retried)
	t.Run("ReleaseOldest", s.oldest)
	t.Run("CapZeroRefuses", s.capZero)
	t.Run("KeysApart", s.apart)
	t.Run("ConcurrentNeverOverCap", s.concurrent)
	t.Run("InvalidHolds", s.invalid)
	if h.HeldKey != nil && h.Redis != nil {
		t.Run("RedisKey", s.redisKey)
	}
}

type holdSuite struct {
	h   *InflightHarness
	run int64
	seq atomic.Int64
}

func (s *holdSuite) id(t *testing.T) string {
	return fmt.Sprintf("bt:%x:%s:%d", s.run, t.Name(), s.seq.Add(1))
}

func hold(id, handle string, cap int64, timeout time.Duration) *bucket.Hold {
	return &bucket.Hold{Identity: id, Name: "r/inflight", Handle: handle, Cap: cap, Timeout: timeout}
}

func (s *holdSuite) acquire(t *testing.T, st bucket.InflightStore, h *bucket.Hold) bucket.HoldResult {
	t.Helper()
	r, err := st.Acquire(context.Background(), h)
	if err != nil {
		t.Fatalf("Acquire(%q, %q): %v", h.Identity, h.Handle, err)
	}
	if s.h.Source != bucket.SourceNone && r.Source != s.h.Source {
		t.Fatalf("Acquire: source %v, want %v", r.Source, s.h.Source)
	}
	return r
}

// capN: N holders are admitted, the N+1st refused until the oldest times out.
func (s *holdSuite) capN(t *testing.T) {
	st, id := s.h.New(t), s.id(t)
	const n, timeout = 5, 30 * time.Second
	for i := range n {
		r := s.acquire(t, st, hold(id, fmt.Sprint("h", i), n, timeout))
		if !r.Held || r.InFlight != int64(i+1) {
			t.Fatalf("holder %d of %d: %+v, want held with %d in flight", i+1, n, r, i+1)
		}
		s.h.Clock.Advance(time.Second)
	}
	r := s.acquire(t, st, hold(id, "one-more", n, timeout))
	if r.Held || r.InFlight != n {
		t.Fatalf("holder %d of cap %d: %+v, want refused with %d in flight", n+1, n, r, n)
	}
	// The oldest was admitted 5 s ago: it times out in 25 s.
	if r.RetryAfter != timeout-n*time.Second {
		t.Fatalf("refused: retry after %v, want %v", r.RetryAfter, timeout-n*time.Second)
	}
	if r.Remaining(n) != 0 {
		t.Fatalf("Remaining %d, want 0", r.Remaining(n))
	}
}

// releaseOnce: a release frees a slot for the next holder; a second release of the same
// handle, and a handle never admitted, are ErrUnknownHandle and free nothing.
func (s *holdSuite) releaseOnce(t *testing.T) {
	ctx := context.Background()
	st, id := s.h.New(t), s.id(t)
	const timeout = 30 * time.Second
	for _, h := range []string{"a", "b"} {
		if r := s.acquire(t, st, hold(id, h, 2, timeout)); !r.Held {
			t.Fatalf("acquire %s: %+v", h, r)
		}
	}
	if err := st.Release(ctx, hold(id, "a", 0, timeout)); err != nil {
		t.Fatalf("release a: %v", err)
	}
	if err := st.Release(ctx, hold(id, "a", 0, timeout)); !errors.Is(err, bucket.ErrUnknownHandle) {
		t.Fatalf("second release of a: %v, want ErrUnknownHandle", err)
	}
	if err := st.Release(ctx, hold(id, "never", 0, timeout)); !errors.Is(err, bucket.ErrUnknownHandle) {
		t.Fatalf("release of a handle never admitted: %v, want ErrUnknownHandle", err)
	}
	if err := st.Release(ctx, hold(s.id(t), "a", 0, timeout)); !errors.Is(err, bucket.ErrUnknownHandle) {
		t.Fatalf("release on an identity that holds nothing: %v, want ErrUnknownHandle", err)
	}
	if r := s.acquire(t, st, hold(id, "c", 2, timeout)); !r.Held || r.InFlight != 2 {
		t.Fatalf("acquire after one release: %+v, want held, 2 in flight", r)
	}
	if r := s.acquire(t, st, hold(id, "d", 2, timeout)); r.Held {
		t.Fatalf("acquire past the cap after the failed releases: %+v, want refused", r)
	}
}

// heals: a holder that never releases frees its slot exactly when its timeout passes, and
// its release afterwards is ErrUnknownHandle.
func (s *holdSuite) heals(t *testing.T) {
	ctx := context.Background()
	st, id := s.h.New(t), s.id(t)
	const timeout = 10 * time.Second
	if r := s.acquire(t, st, hold(id, "lost", 1, timeout)); !r.Held {
		t.Fatalf("acquire: %+v", r)
	}
	s.h.Clock.Advance(timeout - time.Millisecond)
	if r := s.acquire(t, st, hold(id, "next", 1, timeout)); r.Held || r.RetryAfter != time.Millisecond {
		t.Fatalf("1 ms before the timeout: %+v, want refused, retry after 1ms", r)
	}
	s.h.Clock.Advance(time.Millisecond)
	if r := s.acquire(t, st, hold(id, "next", 1, timeout)); !r.Held || r.InFlight != 1 {
		t.Fatalf("at the timeout: %+v, want held, 1 in flight", r)
	}
	if err := st.Release(ctx, hold(id, "lost", 0, timeout)); !errors.Is(err, bucket.ErrUnknownHandle) {
		t.Fatalf("release of the expired handle: %v, want ErrUnknownHandle", err)
	}
	// The expired handle's release freed nothing: "next" still holds the only slot.
	if r := s.acquire(t, st, hold(id, "third", 1, timeout)); r.Held {
		t.Fatalf("after the expired release: %+v, want refused", r)
	}
	// An expired handle released with a timeout is unknown even before an acquire forgot it.
	s.h.Clock.Advance(timeout)
	if err := st.Release(ctx, hold(id, "next", 0, timeout)); !errors.Is(err, bucket.ErrUnknownHandle) {
		t.Fatalf("release of a handle past its timeout: %v, want ErrUnknownHandle", err)
	}
}

// retried: acquiring a handle that holds a slot admits it without a second slot.
func (s *holdSuite) retried(t *testing.T) {
	st, id := s.h.New(t), s.id(t)
	for range 3 {
		if r := s.acquire(t, st, hold(id, "same", 2, time.Minute)); !r.Held || r.InFlight != 1 {
			t.Fatalf("acquire of one handle: %+v, want held, 1 in flight", r)
		}
	}
	if r := s.acquire(t, st, hold(id, "other", 2, time.Minute)); !r.Held || r.InFlight != 2 {
		t.Fatalf("second handle: %+v, want held, 2 in flight", r)
	}
}

// oldest: ReleaseOldest gives back the oldest slot, skipping expired ones; nothing held
// is ErrUnknownHandle.
func (s *holdSuite) oldest(t *testing.T) {
	ctx := context.Background()
	st, id := s.h.New(t), s.id(t)
	const timeout = 10 * time.Second
	for _, h := range []string{"first", "second", "third"} {
		s.acquire(t, st, hold(id, h, 3, timeout))
		s.h.Clock.Advance(time.Second)
	}
	if err := st.ReleaseOldest(ctx, hold(id, "", 0, timeout)); err != nil {
		t.Fatalf("ReleaseOldest: %v", err)
	}
	if err := st.Release(ctx, hold(id, "first", 0, timeout)); !errors.Is(err, bucket.ErrUnknownHandle) {
		t.Fatalf("release of the slot ReleaseOldest gave back: %v, want ErrUnknownHandle", err)
	}
	s.h.Clock.Advance(timeout - 2*time.Second) // "second" times out; "third" is the oldest left
	if err := st.ReleaseOldest(ctx, hold(id, "", 0, timeout)); err != nil {
		t.Fatalf("ReleaseOldest: %v", err)
	}
	if err := st.ReleaseOldest(ctx, hold(id, "", 0, timeout)); !errors.Is(err, bucket.ErrUnknownHandle) {
		t.Fatalf("ReleaseOldest with nothing held: %v, want ErrUnknownHandle", err)
	}
}

func (s *holdSuite) capZero(t *testing.T) {
	st, id := s.h.New(t), s.id(t)
	if r := s.acquire(t, st, hold(id, "h", 0, time.Second)); r.Held || r.InFlight != 0 {
		t.Fatalf("cap 0: %+v, want refused", r)
	}
}

// apart: identities and limit names never share slots, whatever their characters.
func (s *holdSuite) apart(t *testing.T) {
	st, base := s.h.New(t), s.id(t)
	for _, p := range [][2]string{{"a", "x"}, {"a}", "x"}, {"a", "}x"}, {"a{b}", "x"}, {"a%7Bb%7D", "x"}, {"a", ":x"}, {"a:", "x"}, {"a\x00", "x"}} {
		h := &bucket.Hold{Identity: base + p[0], Name: p[1], Handle: "h", Cap: 1, Timeout: time.Minute}
		if r := s.acquire(t, st, h); !r.Held || r.InFlight != 1 {
			t.Fatalf("identity %q name %q: %+v: it shares slots with an earlier pair", h.Identity, h.Name, r)
		}
	}
}

// concurrent: 16 goroutines acquiring from a cap of 10 hold exactly 10 slots.
func (s *holdSuite) concurrent(t *testing.T) {
	st, id := s.h.New(t), s.id(t)
	var held atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16*4)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 4 {
				r, err := st.Acquire(context.Background(), hold(id, fmt.Sprintf("g%d-%d", g, i), 10, time.Minute))
				if err != nil {
					errs <- err
					return
				}
				if r.Held {
					held.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := held.Load(); n != 10 {
		t.Fatalf("64 acquires from 16 goroutines on a cap of 10: %d held", n)
	}
}

// InvalidHolds returns holds every store must refuse with ErrInvalid on Acquire.
func InvalidHolds() map[string]bucket.Hold {
	ok := bucket.Hold{Identity: "id", Name: "n", Handle: "h", Cap: 1, Timeout: time.Second}
	with := func(f func(h *bucket.Hold)) bucket.Hold { h := ok; f(&h); return h }
	return map[string]bucket.Hold{
		"empty identity":   with(func(h *bucket.Hold) { h.Identity = "" }),
		"long identity":    with(func(h *bucket.Hold) { h.Identity = strings.Repeat("x", bucket.MaxIdentityLen+1) }),
		"empty name":       with(func(h *bucket.Hold) { h.Name = "" }),
		"long name":        with(func(h *bucket.Hold) { h.Name = strings.Repeat("x", bucket.MaxNameLen+1) }),
		"empty handle":     with(func(h *bucket.Hold) { h.Handle = "" }),
		"long handle":      with(func(h *bucket.Hold) { h.Handle = strings.Repeat("x", bucket.MaxHandleLen+1) }),
		"negative cap":     with(func(h *bucket.Hold) { h.Cap = -1 }),
		"huge cap":         with(func(h *bucket.Hold) { h.Cap = bucket.MaxConcurrent + 1 }),
		"zero timeout":     with(func(h *bucket.Hold) { h.Timeout = 0 }),
		"negative timeout": with(func(h *bucket.Hold) { h.Timeout = -time.Second }),
		"sub-ms timeout":   with(func(h *bucket.Hold) { h.Timeout = time.Microsecond }),
		"huge timeout":     with(func(h *bucket.Hold) { h.Timeout = bucket.MaxHoldTimeout + 1 }),
	}
}

func (s *holdSuite) invalid(t *testing.T) {
	ctx := context.Background()
	st := s.h.New(t)
	var before uint64
	if s.h.Calls != nil {
		before = s.h.Calls()
	}
	for name, h := range InvalidHolds() {
		if _, err := st.Acquire(ctx, &h); !errors.Is(err, bucket.ErrInvalid) {
			t.Errorf("Acquire %s: %v, want ErrInvalid", name, err)
		}
	}
	if err := st.Release(ctx, hold("id", "", 0, 0)); !errors.Is(err, bucket.ErrInvalid) {
		t.Errorf("Release without a handle: %v, want ErrInvalid", err)
	}
	if err := st.ReleaseOldest(ctx, hold("id", "", 0, 0)); !errors.Is(err, bucket.ErrInvalid) {
		t.Errorf("ReleaseOldest without a timeout: %v, want ErrInvalid", err)
	}
	if s.h.Calls != nil && s.h.Calls() != before {
		t.Errorf("invalid holds sent %d commands, want 0", s.h.Calls()-before)
	}
}

// redisKey: the slots live in the identity's cluster slot and expire a timeout after
// the newest was admitted, so a key nobody acquires again vanishes.
func (s *holdSuite) redisKey(t *testing.T) {
	ctx := context.Background()
	st, id := s.h.New(t), s.id(t)+"{x}"
	h := hold(id, "h", 3, 20*time.Second)
	s.acquire(t, st, h)
	key := s.h.HeldKey(id, h.Name)
	if got, want := hashTag(key), hashTag(s.h.Redis.Key(id, "bucket")); got != want {
		t.Fatalf("in-flight key %q has hash tag %q, buckets %q", key, got, want)
	}
	c := s.h.Redis.Client
	ttl, err := c.PTTL(ctx, key).Result()
	if err != nil || ttl <= 0 || ttl > 20*time.Second+time.Millisecond {
		t.Fatalf("PTTL %v (%v), want in (0, 20.001s]", ttl, err)
	}
	if n, err := c.ZCard(ctx, key).Result(); err != nil || n != 1 {
		t.Fatalf("ZCARD %d (%v), want 1", n, err)
	}
	if err := st.Release(ctx, h); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Exists(ctx, key).Result(); err != nil || n != 0 {
		t.Fatalf("after the last release the key exists (%d, %v)", n, err)
	}
}
