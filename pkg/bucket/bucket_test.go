package bucket

import (
	"math"
	"testing"
)

const sec = int64(1e6) // one second in µs

// step is one take at time at (µs) with its expected answer, in the style of
// x/time/rate's tests.
type step struct {
	at        int64
	want, min int64
	granted   int64
	limiting  int
	remaining int64
	retry     int64 // µs
	reset     int64 // µs
}

// runSteps plays steps against buckets kept the way a store keeps them (write only when
// granted) and checks every figure.
func runSteps(t *testing.T, limits []Limit, steps []step) {
	t.Helper()
	states := make([]State, len(limits))
	tokens := make([]float64, len(limits))
	for i, s := range steps {
		for j, l := range limits {
			tokens[j] = l.TokensAt(states[j], s.at)
		}
		d := Decide(limits, tokens, s.want, s.min)
		got := step{s.at, s.want, s.min, d.Granted, d.Limiting, d.Remaining, d.RetryAfterMicros, d.ResetMicros}
		if got != s {
			t.Fatalf("step %d: got  %+v\nwant %+v", i, got, s)
		}
		if d.Granted > 0 {
			for j := range limits {
				states[j] = State{Tokens: tokens[j], Last: s.at}
			}
		}
	}
}

func TestDecideSteps(t *testing.T) {
	const t0 = 1_700_000_000 * sec
	t.Run("burst then refill", func(t *testing.T) {
		// 10 a second, bursts of 3: a token every 100 ms.
		runSteps(t, []Limit{{Name: "s", Rate: 10, Burst: 3}}, []step{
			{at: t0, want: 1, min: 1, granted: 1, remaining: 2, reset: 100_000},
			{at: t0, want: 1, min: 1, granted: 1, remaining: 1, reset: 200_000},
			{at: t0, want: 1, min: 1, granted: 1, remaining: 0, reset: 300_000},
			{at: t0, want: 1, min: 1, granted: 0, remaining: 0, retry: 100_000, reset: 300_000},
			{at: t0 + 99_999, want: 1, min: 1, granted: 0, remaining: 0, retry: 1, reset: 200_001},
			{at: t0 + 100_000, want: 1, min: 1, granted: 1, remaining: 0, reset: 300_000},
			{at: t0 + 150_000, want: 1, min: 1, granted: 0, remaining: 0, retry: 50_000, reset: 250_000},
			// an hour later the bucket is full, never more than burst
			{at: t0 + 3600*sec, want: 3, min: 3, granted: 3, remaining: 0, reset: 300_000},
		})
	})
	t.Run("partial grants", func(t *testing.T) {
		runSteps(t, []Limit{{Name: "s", Rate: 1, Burst: 10}}, []step{
			{at: t0, want: 4, min: 1, granted: 4, remaining: 6, reset: 4 * sec},
			{at: t0, want: 4, min: 1, granted: 4, remaining: 2, reset: 8 * sec},
			{at: t0, want: 4, min: 1, granted: 2, remaining: 0, reset: 10 * sec},
			{at: t0, want: 4, min: 1, granted: 0, remaining: 0, retry: sec, reset: 10 * sec},
			// 1.5 tokens: min 2 waits half a second more; min 1 gets 1
			{at: t0 + 1500_000, want: 4, min: 2, granted: 0, remaining: 1, retry: 500_000, reset: 8500_000},
			{at: t0 + 1500_000, want: 4, min: 1, granted: 1, remaining: 0, reset: 9500_000},
		})
	})
	t.Run("all or nothing over two limits", func(t *testing.T) {
		// a fast limit (1/s, burst 2) and a slow one (1 per 4 s, burst 3); rates that are
		// exact in binary keep the figures exact.
		limits := []Limit{{Name: "s", Rate: 1, Burst: 2}, {Name: "slow", Rate: 0.25, Burst: 3}}
		runSteps(t, limits, []step{
			{at: t0, want: 1, min: 1, granted: 1, limiting: 0, remaining: 1, reset: sec},
			{at: t0, want: 1, min: 1, granted: 1, limiting: 0, remaining: 0, reset: 2 * sec},
			// refused by the fast limit: the slow one keeps its token
			{at: t0, want: 1, min: 1, granted: 0, limiting: 0, remaining: 0, retry: sec, reset: 2 * sec},
			{at: t0 + sec, want: 1, min: 1, granted: 1, limiting: 0, remaining: 0, reset: 2 * sec},
			// both short: the longest wait decides (fast 0.5 s, slow 2.5 s)
			{at: t0 + 1500_000, want: 1, min: 1, granted: 0, limiting: 1, remaining: 0, retry: 2500_000, reset: 10500_000},
		})
	})
	t.Run("clock going back refills nothing", func(t *testing.T) {
		runSteps(t, []Limit{{Name: "s", Rate: 1, Burst: 1}}, []step{
			{at: t0, want: 1, min: 1, granted: 1, remaining: 0, reset: sec},
			{at: t0 - 10*sec, want: 1, min: 1, granted: 0, remaining: 0, retry: sec, reset: sec},
		})
	})
}

func TestMicrosUntilIsCapped(t *testing.T) {
	l := Limit{Name: "slow", Rate: 1e-300, Burst: MaxBurst}
	if got := l.MicrosUntil(0, MaxBurst); got != MaxWaitMicros {
		t.Fatalf("MicrosUntil = %d, want the cap %d", got, int64(MaxWaitMicros))
	}
	d := Decide([]Limit{l}, []float64{0}, 1, 1)
	if r := ResultOf(d, SourceMemory); r.RetryAfter <= 0 || r.Reset <= 0 {
		t.Fatalf("retry %v reset %v: a tiny rate must not overflow into a negative wait", r.RetryAfter, r.Reset)
	}
}

func TestTokensAt(t *testing.T) {
	l := Limit{Name: "s", Rate: 2, Burst: 5}
	for _, c := range []struct {
		st   State
		now  int64
		want float64
	}{
		{State{}, 123, 5}, // never seen: full
		{State{Tokens: 1, Last: 10 * sec}, 10 * sec, 1},
		{State{Tokens: 1, Last: 10 * sec}, 11 * sec, 3},
		{State{Tokens: 1, Last: 10 * sec}, 100 * sec, 5}, // capped
		{State{Tokens: 1, Last: 10 * sec}, 9 * sec, 1},   // clock back: no refill
		{State{Tokens: 7, Last: 10 * sec}, 10 * sec, 5},  // burst lowered: clamped
	} {
		if got := l.TokensAt(c.st, c.now); got != c.want {
			t.Errorf("TokensAt(%+v, %d) = %g, want %g", c.st, c.now, got, c.want)
		}
	}
}

// FuzzDecide checks the invariants of the math over arbitrary buckets and requests:
// grants are 0 or in [min, want], never above what any bucket holds, leave no bucket
// negative; a refusal changes nothing and names a wait after which min is available;
// refill is monotone in time and capped at burst.
func FuzzDecide(f *testing.F) {
	f.Add(uint8(2), 10.0, 20.0, 0.5, 1.0/60, 100.0, 0.9, uint16(3), uint16(1), uint32(1000))
	f.Add(uint8(1), 1e9, 1e12, 0.0, 1e-9, 1.0, 0.0, uint16(1), uint16(0), uint32(0))
	f.Add(uint8(2), 0.001, 5.0, 0.2, 3.0, 7.0, 1.0, uint16(5), uint16(2), uint32(123456))
	f.Fuzz(func(t *testing.T, n uint8, r1, b1, f1, r2, b2, f2 float64, want, min uint16, dt uint32) {
		lim := []Limit{{Name: "a", Rate: r1, Burst: b1}, {Name: "b", Rate: r2, Burst: b2}}[:1+int(n%2)]
		fill := []float64{f1, f2}
		req := Request{Identity: "fuzz", Limits: lim, Want: int64(want), Min: int64(min)}
		if req.Validate() != nil {
			return
		}
		tokens := make([]float64, len(lim))
		for i, l := range lim {
			fr := math.Abs(fill[i])
			if math.IsNaN(fr) || math.IsInf(fr, 0) {
				return
			}
			tokens[i] = l.Burst * math.Mod(fr, 1.0000001)
			if tokens[i] > l.Burst {
				tokens[i] = l.Burst
			}
			// refill: monotone in time, capped at burst
			st := State{Tokens: tokens[i], Last: 1e15}
			a, b := l.TokensAt(st, 1e15+int64(dt)), l.TokensAt(st, 1e15+2*int64(dt))
			if a < tokens[i] || b < a || b > l.Burst {
				t.Fatalf("refill of %+v: %g then %g then %g (burst %g)", l, tokens[i], a, b, l.Burst)
			}
		}
		before := append([]float64(nil), tokens...)
		mn := req.MinGrant()
		d := Decide(lim, tokens, req.Want, mn)
		if d.Limiting < 0 || d.Limiting >= len(lim) || d.Remaining < 0 || d.ResetMicros < 0 {
			t.Fatalf("decision %+v out of range", d)
		}
		if d.Granted == 0 {
			for i := range tokens {
				if tokens[i] != before[i] {
					t.Fatalf("refusal changed bucket %d: %g -> %g", i, before[i], tokens[i])
				}
			}
			if d.RetryAfterMicros <= 0 {
				t.Fatalf("refused with retry-after %d", d.RetryAfterMicros)
			}
			// after the wait, every bucket holds min (unless the wait was capped)
			if d.RetryAfterMicros < MaxWaitMicros {
				for i, l := range lim {
					at := l.TokensAt(State{Tokens: before[i], Last: 1e15}, 1e15+d.RetryAfterMicros)
					if math.Floor(at+eps) < float64(mn) {
						t.Fatalf("bucket %d holds %g after the retry-after %d µs, min %d", i, at, d.RetryAfterMicros, mn)
					}
				}
			}
			return
		}
		if d.Granted < mn || d.Granted > req.Want || d.RetryAfterMicros != 0 {
			t.Fatalf("granted %d outside [%d, %d] (retry %d)", d.Granted, mn, req.Want, d.RetryAfterMicros)
		}
		for i := range tokens {
			if float64(d.Granted) > before[i]+eps || tokens[i] < -eps {
				t.Fatalf("bucket %d held %g, granted %d, left %g", i, before[i], d.Granted, tokens[i])
			}
			if tokens[i] < tokens[d.Limiting] {
				t.Fatalf("limiting bucket %d holds %g but bucket %d holds less, %g", d.Limiting, tokens[d.Limiting], i, tokens[i])
			}
		}
	})
}
