// Package buckettest is the conformance suite for bucket.Store implementations: one set
// of checks run against the memory store (fake clock, exact figures), a single Redis and a
// Redis Cluster (real clock, tolerances and bounded polls), and reusable by the layers
// above (pkg/lease, pkg/fallback) for the checks that apply to them.
//
// With a fake clock the suite checks every figure exactly and never sleeps. Against a real
// clock it uses rates slow enough that milliseconds of jitter cannot change a whole-token
// answer, accepts waits that are shorter by at most Tolerance (time passes, buckets
// refill, waits only shrink), and waits for refills with bounded polls of a few hundred
// milliseconds at most.
package buckettest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
)

// Harness describes the store under test.
type Harness struct {
	// New returns the store for one subtest. It may return the same store every time:
	// each subtest uses identities of its own.
	New func(t *testing.T) bucket.Store
	// Clock is the fake clock the store reads, or nil if the store reads real time
	// (Redis's TIME). With a fake clock figures are checked exactly.
	Clock *clock.Fake
	// Tolerance is how much shorter than computed a wait (retry-after, reset) may be on a
	// real clock: time passing between the takes of one check. Default 2 s, against waits
	// of 100 s and more.
	Tolerance time.Duration
	// Source, when not SourceNone, is the Source every answer must carry.
	Source bucket.Source
	// Calls, when set, counts what the store sends to its backend (for Redis: every
	// command reaching the client). The suite checks invalid requests send nothing.
	Calls func() uint64
	// Redis, when set, lets the suite look at the keys behind the store (expiry, hash-tag
	// placement, key escaping, NOSCRIPT recovery).
	Redis *RedisBackend
}

func (h *Harness) exact() bool { return h.Clock != nil }

func (h *Harness) tol() time.Duration {
	if h.exact() {
		return 0
	}
	if h.Tolerance > 0 {
		return h.Tolerance
	}
	return 2 * time.Second
}

// Run runs every check as a subtest of t.
func Run(t *testing.T, h Harness) {
	if h.New == nil {
		t.Fatal("buckettest: Harness.New is nil")
	}
	s := &suite{h: &h, run: time.Now().UnixNano()}
	t.Run("Burst", s.burst)
	t.Run("Refill", s.refill)
	t.Run("RefillCappedAtBurst", s.refillCapped)
	t.Run("FractionalBurst", s.fractionalBurst)
	t.Run("AllOrNothing", s.allOrNothing)
	t.Run("LongestWaitDecides", s.longestWait)
	t.Run("PartialGrants", s.partial)
	t.Run("RetryAfterForMin", s.retryForMin)
	t.Run("IdleBucketIsFull", s.idleIsFull)
	t.Run("IdentitiesDoNotCollide", s.noCollisions)
	t.Run("ConcurrentTakesNeverOverGrant", s.concurrent)
	t.Run("InvalidRequests", s.invalid)
	t.Run("Sightings", s.sightings)
	if h.Redis != nil {
		t.Run("Redis", func(t *testing.T) { s.redis(t) })
	}
}

type suite struct {
	h   *Harness
	run int64 // tells this run's identities from earlier runs' on a shared Redis
}

// id returns an identity unique to this run and subtest.
func (s *suite) id(t *testing.T, suffix string) string {
	return fmt.Sprintf("bt:%x:%s:%s", s.run, t.Name(), suffix)
}

func (s *suite) take(t *testing.T, st bucket.Store, id string, want, min int64, limits ...bucket.Limit) bucket.Result {
	t.Helper()
	r, err := st.Take(context.Background(), &bucket.Request{Identity: id, Limits: limits, Want: want, Min: min})
	if err != nil {
		t.Fatalf("Take(%q, want %d, min %d): %v", id, want, min, err)
	}
	if s.h.Source != bucket.SourceNone && r.Source != s.h.Source {
		t.Fatalf("Take(%q): source %v, want %v", id, r.Source, s.h.Source)
	}
	if r.Granted != 0 && (r.Granted < minGrant(want, min) || r.Granted > want) {
		t.Fatalf("Take(%q, want %d, min %d): granted %d", id, want, min, r.Granted)
	}
	return r
}

func minGrant(want, min int64) int64 {
	if min <= 0 {
		return want
	}
	return min
}

// expect checks a result: granted, limiting and remaining exactly; retry-after and reset
// exactly on a fake clock, else within [want - tolerance, want].
func (s *suite) expect(t *testing.T, what string, r bucket.Result, granted int64, limiting int, remaining int64, retry, reset time.Duration) {
	t.Helper()
	if r.Granted != granted || r.Limiting != limiting || r.Remaining != remaining {
		t.Fatalf("%s: granted %d limiting %d remaining %d, want %d %d %d (%+v)",
			what, r.Granted, r.Limiting, r.Remaining, granted, limiting, remaining, r)
	}
	s.near(t, what+": retry-after", r.RetryAfter, retry)
	s.near(t, what+": reset", r.Reset, reset)
}

func (s *suite) near(t *testing.T, what string, got, want time.Duration) {
	t.Helper()
	if got > want || got < want-s.h.tol() {
		if s.h.exact() {
			t.Fatalf("%s: %v, want %v", what, got, want)
		}
		t.Fatalf("%s: %v, want within [%v, %v]", what, got, want-s.h.tol(), want)
	}
}

// pass lets d go by: the fake clock advances; on a real clock it sleeps (used only for
// short waits on a real server).
func (s *suite) pass(d time.Duration) {
	if s.h.exact() {
		s.h.Clock.Advance(d)
		return
	}
	time.Sleep(d)
}

// slow is a bucket whose refill cannot change a whole-token answer within a check on a
// real clock: one token per 1024 s. Rates that are powers of two keep the float figures
// exact.
func slow(name string, burst float64) bucket.Limit {
	return bucket.Limit{Name: name, Rate: 1.0 / 1024, Burst: burst}
}

// medium refills a token per 128 s.
func medium(name string, burst float64) bucket.Limit {
	return bucket.Limit{Name: name, Rate: 1.0 / 128, Burst: burst}
}

const (
	tokenOfSlow   = 1024 * time.Second
	tokenOfMedium = 128 * time.Second
)

func (s *suite) burst(t *testing.T) {
	st, id := s.h.New(t), s.id(t, "k")
	l := slow("burst", 5)
	for i := int64(1); i <= 5; i++ {
		r := s.take(t, st, id, 1, 0, l)
		s.expect(t, fmt.Sprintf("take %d", i), r, 1, 0, 5-i, 0, time.Duration(i)*tokenOfSlow)
	}
	r := s.take(t, st, id, 1, 0, l)
	s.expect(t, "take beyond the burst", r, 0, 0, 0, tokenOfSlow, 5*tokenOfSlow)
}

func (s *suite) refill(t *testing.T) {
	st, id := s.h.New(t), s.id(t, "k")
	// 20 a second, burst 1: a token every 50 ms.
	l := bucket.Limit{Name: "refill", Rate: 20, Burst: 1}
	start := time.Now()
	if r := s.take(t, st, id, 1, 0, l); r.Granted != 1 {
		t.Fatalf("first take: %+v", r)
	}
	r := s.take(t, st, id, 1, 0, l)
	if r.Granted != 0 || r.RetryAfter <= 0 || r.RetryAfter > 50*time.Millisecond {
		t.Fatalf("second take: %+v, want refused with retry-after in (0, 50ms]", r)
	}
	if s.h.exact() {
		s.expect(t, "second take", r, 0, 0, 0, 50*time.Millisecond, 50*time.Millisecond)
		s.pass(50*time.Millisecond - time.Microsecond)
		r = s.take(t, st, id, 1, 0, l)
		// 0.99998 tokens is not exact in binary: the wait rounds up to 1 or 2 µs
		if r.Granted != 0 || r.RetryAfter < time.Microsecond || r.RetryAfter > 2*time.Microsecond {
			t.Fatalf("1 µs before the token: %+v, want refused, retry-after 1-2 µs", r)
		}
		s.pass(time.Microsecond)
		r = s.take(t, st, id, 1, 0, l)
		s.expect(t, "when the token is due", r, 1, 0, 0, 0, 50*time.Millisecond)
		return
	}
	// Real clock: poll (bounded) until granted. The store's clock cannot grant before
	// 50 ms after the first take, which began after start.
	deadline := time.Now().Add(2 * time.Second)
	for r.Granted == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no token 2 s after a refused take (last %+v)", r)
		}
		time.Sleep(min(r.RetryAfter, 20*time.Millisecond))
		r = s.take(t, st, id, 1, 0, l)
	}
	if el := time.Since(start); el < 50*time.Millisecond {
		t.Fatalf("a second token after %v, want >= 50ms", el)
	}
}

func (s *suite) refillCapped(t *testing.T) {
	st, id := s.h.New(t), s.id(t, "k")
	l := bucket.Limit{Name: "capped", Rate: 1000, Burst: 3}
	if r := s.take(t, st, id, 1, 0, l); r.Granted != 1 {
		t.Fatalf("first take: %+v", r)
	}
	s.pass(30 * time.Millisecond) // 30 tokens' worth of refill, capped at 3
	r := s.take(t, st, id, 3, 1, l)
	if r.Granted != 3 || r.Remaining != 0 {
		t.Fatalf("after a long refill: %+v, want granted 3 (the burst) and 0 left", r)
	}
	if s.h.exact() {
		s.expect(t, "after a long refill", r, 3, 0, 0, 0, 3*time.Millisecond)
	}
}

// fractionalBurst: a burst of 2.5 tokens (a region's half of a burst of 5, as
// rules.Compiled.LimitsFor gives it) admits two requests at once, and its half token makes
// the third due after half a token's refill, not a whole one.
func (s *suite) fractionalBurst(t *testing.T) {
	st, id := s.h.New(t), s.id(t, "k")
	l := bucket.Limit{Name: "fraction", Rate: 1, Burst: 2.5}
	for i := range 2 {
		if r := s.take(t, st, id, 1, 0, l); r.Granted != 1 {
			t.Fatalf("take %d of a burst of 2.5: %+v", i+1, r)
		}
	}
	r := s.take(t, st, id, 1, 0, l)
	if r.Granted != 0 || r.RetryAfter <= 0 || r.RetryAfter > 500*time.Millisecond {
		t.Fatalf("third take: %+v, want refused with retry-after in (0, 500ms]: half a token at 1/s", r)
	}
	if s.h.exact() {
		s.expect(t, "third take", r, 0, 0, 0, 500*time.Millisecond, 2*time.Second) // full again in 2 s
	}
}

// allOrNothing: a request refused by one limit takes nothing from the others.
func (s *suite) allOrNothing(t *testing.T) {
	st, id := s.h.New(t), s.id(t, "k")
	fast := medium("per-second", 2) // the faster of the two
	minute := slow("per-minute", 3)
	s.expect(t, "take 1", s.take(t, st, id, 1, 0, fast, minute), 1, 0, 1, 0, tokenOfMedium)
	s.expect(t, "take 2", s.take(t, st, id, 1, 0, fast, minute), 1, 0, 0, 0, 2*tokenOfMedium)
	s.expect(t, "take 3 (fast limit empty)", s.take(t, st, id, 1, 0, fast, minute), 0, 0, 0, tokenOfMedium, 2*tokenOfMedium)
	// The per-minute bucket still holds its third token: the refusal took nothing.
	s.expect(t, "per-minute alone", s.take(t, st, id, 1, 0, minute), 1, 0, 0, 0, 3*tokenOfSlow)
	s.expect(t, "per-minute alone again", s.take(t, st, id, 1, 0, minute), 0, 0, 0, tokenOfSlow, 3*tokenOfSlow)
}

// longestWait: when several limits refuse, the one with the longest wait is named.
func (s *suite) longestWait(t *testing.T) {
	st, id := s.h.New(t), s.id(t, "k")
	a := medium("a", 1)
	b := slow("b", 1)
	// both left empty: the first with the fewest tokens is the limiting one
	s.expect(t, "take", s.take(t, st, id, 1, 0, a, b), 1, 0, 0, 0, tokenOfMedium)
	s.expect(t, "refused by both", s.take(t, st, id, 1, 0, a, b), 0, 1, 0, tokenOfSlow, tokenOfSlow)
	s.expect(t, "refused by both, order swapped", s.take(t, st, id, 1, 0, b, a), 0, 0, 0, tokenOfSlow, tokenOfSlow)
}

func (s *suite) partial(t *testing.T) {
	st, id := s.h.New(t), s.id(t, "k")
	l := slow("partial", 10)
	s.expect(t, "4 of 4", s.take(t, st, id, 4, 1, l), 4, 0, 6, 0, 4*tokenOfSlow)
	s.expect(t, "4 of 4 again", s.take(t, st, id, 4, 1, l), 4, 0, 2, 0, 8*tokenOfSlow)
	s.expect(t, "2 of 4", s.take(t, st, id, 4, 1, l), 2, 0, 0, 0, 10*tokenOfSlow)
	s.expect(t, "none left", s.take(t, st, id, 4, 1, l), 0, 0, 0, tokenOfSlow, 10*tokenOfSlow)
	// Two limits: the grant is what both allow.
	id2 := s.id(t, "two")
	other := slow("other", 4)
	s.expect(t, "other alone", s.take(t, st, id2, 2, 0, other), 2, 0, 2, 0, 2*tokenOfSlow)
	s.expect(t, "two limits", s.take(t, st, id2, 4, 1, l, other), 2, 1, 0, 0, 4*tokenOfSlow)
	s.expect(t, "two limits, min above what is left", s.take(t, st, id2, 4, 2, l, other), 0, 1, 0, 2*tokenOfSlow, 4*tokenOfSlow)
}

// retryForMin: the retry-after of a refusal is the wait until min tokens, not one.
func (s *suite) retryForMin(t *testing.T) {
	st, id := s.h.New(t), s.id(t, "k")
	l := slow("min", 5)
	s.expect(t, "take 4", s.take(t, st, id, 4, 0, l), 4, 0, 1, 0, 4*tokenOfSlow)
	s.expect(t, "want 3, min 3", s.take(t, st, id, 3, 3, l), 0, 0, 1, 2*tokenOfSlow, 4*tokenOfSlow)
	s.expect(t, "want 3, min 0 (all or nothing)", s.take(t, st, id, 3, 0, l), 0, 0, 1, 2*tokenOfSlow, 4*tokenOfSlow)
	s.expect(t, "want 3, min 1", s.take(t, st, id, 3, 1, l), 1, 0, 0, 0, 5*tokenOfSlow)
}

// idleIsFull: a bucket idle until it would be full answers as a full one, however the
// store forgets it.
func (s *suite) idleIsFull(t *testing.T) {
	st, id := s.h.New(t), s.id(t, "k")
	l := bucket.Limit{Name: "idle", Rate: 100, Burst: 2} // full again 20 ms after emptied
	s.take(t, st, id, 2, 0, l)
	s.pass(25 * time.Millisecond)
	r := s.take(t, st, id, 2, 0, l)
	if r.Granted != 2 || r.Remaining != 0 {
		t.Fatalf("after idling past full: %+v, want 2 granted", r)
	}
}

// noCollisions: identities and names that look alike once joined never share a bucket.
func (s *suite) noCollisions(t *testing.T) {
	st := s.h.New(t)
	base := s.id(t, "")
	pairs := [][2]string{
		{"a", "x"}, {"a}:x", "x"}, {"a", "x}:x"}, {"a{b}", "x"}, {"a%7Bb%7D", "x"},
		{"a{", "x"}, {"a%7B", "x"}, {"a}", "x"}, {"a%7D", "x"}, {"a%", "x"}, {"a%25", "x"},
		{"{a}", "x"}, {"}{", "x"}, {"a:", "x"}, {"a", ":x"}, {"a\x00", "x"}, {"a", "\x00x"},
	}
	for _, p := range pairs {
		r := s.take(t, st, base+p[0], 1, 0, slow(p[1], 1))
		if r.Granted != 1 {
			t.Fatalf("identity %q name %q: refused (%+v): it shares a bucket with an earlier pair", base+p[0], p[1], r)
		}
	}
}

// concurrent: many goroutines taking from one bucket get exactly its burst.
func (s *suite) concurrent(t *testing.T) {
	st, id := s.h.New(t), s.id(t, "k")
	l := slow("conc", 50)
	var granted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 8; i++ {
				r, err := st.Take(context.Background(), &bucket.Request{Identity: id, Limits: []bucket.Limit{l}, Want: 1})
				if err != nil {
					errs <- err
					return
				}
				granted.Add(r.Granted)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if g := granted.Load(); g != 50 {
		t.Fatalf("16 goroutines × 8 takes from a bucket of 50: granted %d", g)
	}
}

// InvalidRequests returns requests every store must refuse with ErrInvalid.
func InvalidRequests() map[string]bucket.Request {
	ok := bucket.Limit{Name: "ok", Rate: 1, Burst: 10}
	lim := func(rate, burst float64) []bucket.Limit { return []bucket.Limit{{Name: "l", Rate: rate, Burst: burst}} }
	many := make([]bucket.Limit, bucket.MaxLimits+1)
	for i := range many {
		many[i] = bucket.Limit{Name: fmt.Sprint("l", i), Rate: 1, Burst: 1}
	}
	long := make([]byte, bucket.MaxIdentityLen+1)
	for i := range long {
		long[i] = 'k'
	}
	return map[string]bucket.Request{
		"empty identity":     {Identity: "", Limits: []bucket.Limit{ok}, Want: 1},
		"oversized identity": {Identity: string(long), Limits: []bucket.Limit{ok}, Want: 1},
		"no limits":          {Identity: "k", Want: 1},
		"too many limits":    {Identity: "k", Limits: many, Want: 1},
		"duplicate names":    {Identity: "k", Limits: []bucket.Limit{ok, ok}, Want: 1},
		"empty name":         {Identity: "k", Limits: []bucket.Limit{{Rate: 1, Burst: 1}}, Want: 1},
		"NaN rate":           {Identity: "k", Limits: lim(math.NaN(), 1), Want: 1},
		"+Inf rate":          {Identity: "k", Limits: lim(math.Inf(1), 1), Want: 1},
		"-Inf rate":          {Identity: "k", Limits: lim(math.Inf(-1), 1), Want: 1},
		"zero rate":          {Identity: "k", Limits: lim(0, 1), Want: 1},
		"negative rate":      {Identity: "k", Limits: lim(-1, 1), Want: 1},
		"absurd rate":        {Identity: "k", Limits: lim(1e300, 1), Want: 1},
		"NaN burst":          {Identity: "k", Limits: lim(1, math.NaN()), Want: 1},
		"+Inf burst":         {Identity: "k", Limits: lim(1, math.Inf(1)), Want: 1},
		"zero burst":         {Identity: "k", Limits: lim(1, 0), Want: 1},
		"negative burst":     {Identity: "k", Limits: lim(1, -5), Want: 1},
		"absurd burst":       {Identity: "k", Limits: lim(1, 1e300), Want: 1},
		"oversized sight":    {Identity: "k", Limits: []bucket.Limit{ok}, Want: 1, Sight: strings.Repeat("e", bucket.MaxSightLen+1), SightTTL: time.Second},
		"sight without ttl":  {Identity: "k", Limits: []bucket.Limit{ok}, Want: 1, Sight: "e"},
		"sight ttl too long": {Identity: "k", Limits: []bucket.Limit{ok}, Want: 1, Sight: "e", SightTTL: bucket.MaxSightTTL + 1},
		"zero want":          {Identity: "k", Limits: []bucket.Limit{ok}, Want: 0},
		"negative want":      {Identity: "k", Limits: []bucket.Limit{ok}, Want: -1},
		"want above burst":   {Identity: "k", Limits: []bucket.Limit{ok}, Want: 11},
		"min above want":     {Identity: "k", Limits: []bucket.Limit{ok}, Want: 2, Min: 3},
		"negative min":       {Identity: "k", Limits: []bucket.Limit{ok}, Want: 2, Min: -1},
	}
}

func (s *suite) invalid(t *testing.T) {
	st := s.h.New(t)
	var before uint64
	if s.h.Calls != nil {
		before = s.h.Calls()
	}
	for name, req := range InvalidRequests() {
		r, err := st.Take(context.Background(), &req)
		if !errors.Is(err, bucket.ErrInvalid) {
			t.Errorf("%s: got %+v, %v; want an error wrapping bucket.ErrInvalid", name, r, err)
		}
	}
	if s.h.Calls != nil {
		if n := s.h.Calls() - before; n != 0 {
			t.Errorf("invalid requests made %d backend calls, want 0", n)
		}
	}
}

// sightings: a request with Sight records its taker and counts the distinct takers of
// the identity within SightTTL, granted or refused; a taker seen again counts once; a
// sighting older than the TTL no longer counts; an identity remembers MaxSightings.
func (s *suite) sightings(t *testing.T) {
	st, id := s.h.New(t), s.id(t, "k")
	ttl := time.Hour
	if !s.h.exact() {
		ttl = 300 * time.Millisecond // long next to a call, short enough to wait out
	}
	one := slow("one", 1)
	sight := func(who string) bucket.Result {
		t.Helper()
		r, err := st.Take(context.Background(), &bucket.Request{Identity: id, Limits: []bucket.Limit{one}, Want: 1, Sight: who, SightTTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := sight("enf-a"); r.Granted != 1 || r.Seen != 1 {
		t.Fatalf("first sighting: %+v, want granted and seen 1", r)
	}
	if r := sight("enf-b"); r.Granted != 0 || r.Seen != 2 {
		t.Fatalf("second taker, refused: %+v, want seen 2", r)
	}
	if r := sight("enf-a"); r.Seen != 2 {
		t.Fatalf("a taker seen again: %+v, want seen 2", r)
	}
	if r := s.take(t, st, id, 1, 0, one); r.Seen != 0 {
		t.Fatalf("a request without Sight: %+v, want seen 0", r)
	}
	// Past the TTL only the newest sighting counts.
	if s.h.exact() {
		s.h.Clock.Advance(ttl + time.Millisecond)
	} else {
		time.Sleep(ttl + 20*time.Millisecond)
	}
	if r := sight("enf-c"); r.Seen != 1 {
		t.Fatalf("after the TTL: %+v, want seen 1", r)
	}
	// A bounded set: the most distinct takers remembered per identity.
	id2 := s.id(t, "many")
	var last bucket.Result
	for i := range bucket.MaxSightings + 5 {
		r, err := st.Take(context.Background(), &bucket.Request{Identity: id2, Limits: []bucket.Limit{one}, Want: 1,
			Sight: fmt.Sprint("enf-", i), SightTTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		last = r
	}
	if last.Seen != bucket.MaxSightings {
		t.Fatalf("after %d takers: seen %d, want %d", bucket.MaxSightings+5, last.Seen, bucket.MaxSightings)
	}
}
