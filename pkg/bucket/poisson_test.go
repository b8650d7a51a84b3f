package bucket

import (
	"math"
	"math/rand/v2"
	"testing"
)

// closedRefused is PoissonRefused from Erlang's closed form of the M/D/1 queue's waiting
// time, F(x) = Σ_{k ≤ x·rate} e^{λ(x−k/rate)} (−λ(x−k/rate))^k / k!: exact, but an
// alternating sum whose terms grow as e^{λx}, so only for small λ·K.
func closedRefused(rate, burst, arrivals float64) float64 {
	d, k := 1/rate, (burst-1)/rate
	f := 0.0
	for j := 0; float64(j)*d <= k+1e-12; j++ {
		u := k - float64(j)*d
		f += math.Exp(arrivals*u) * math.Pow(-arrivals*u, float64(j)) / math.Gamma(float64(j)+1)
	}
	rho := arrivals / rate
	return 1 - f/(1+rho*f)
}

// simulatedRefused runs n Poisson arrivals through one bucket.
func simulatedRefused(rate, burst, arrivals float64, n int, seed uint64) float64 {
	rng := rand.New(rand.NewPCG(seed, 1))
	t, last, tokens, refused := 0.0, 0.0, burst, 0
	for range n {
		t += rng.ExpFloat64() / arrivals
		tokens = min(burst, tokens+(t-last)*rate)
		last = t
		if tokens >= 1 {
			tokens--
		} else {
			refused++
		}
	}
	return float64(refused) / float64(n)
}

func TestPoissonRefused(t *testing.T) {
	for _, c := range []struct{ rate, burst, arrivals float64 }{
		{4, 4, 2}, {4.0 / 3, 4.0 / 3, 2.0 / 3}, {4.0 / 3, 1, 0.5}, {2, 2, 1}, {2, 2, 1.5},
		{3, 3, 4}, {6, 6, 5}, {10, 10, 8}, {1.33, 2, 0.67}, {2.5, 2.5, 1.2}, {100, 12, 60},
		{1.0 / 60, 1, 1.0 / 120},
	} {
		got := PoissonRefused(c.rate, c.burst, c.arrivals)
		if want := closedRefused(c.rate, c.burst, c.arrivals); math.Abs(got-want) > 1e-4 {
			t.Errorf("PoissonRefused(%g, %g, %g) = %.6f, the closed form %.6f", c.rate, c.burst, c.arrivals, got, want)
		}
	}
	// Bursts where the closed form's sum cancels away: against a bucket run on 400,000
	// arrivals (sampling error about √(p/n) ≈ 0.0005 at p = 10%).
	for _, c := range []struct{ rate, burst, arrivals float64 }{
		{40, 40, 38}, {30, 30, 33}, {19, 19, 18},
	} {
		got := PoissonRefused(c.rate, c.burst, c.arrivals)
		want := simulatedRefused(c.rate, c.burst, c.arrivals, 400_000, 7)
		if math.Abs(got-want) > 0.003 {
			t.Errorf("PoissonRefused(%g, %g, %g) = %.4f, a simulated bucket %.4f", c.rate, c.burst, c.arrivals, got, want)
		}
	}
}

func TestPoissonRefusedEdges(t *testing.T) {
	for _, c := range []struct {
		rate, burst, arrivals, want float64
	}{
		{4, 4, 0, 0}, {4, 0.5, 1, 1}, {0, 4, 1, 1}, {4, 4, math.Inf(1), 1}, {4, 4, math.NaN(), 0},
		{4, math.NaN(), 1, 1}, {math.NaN(), 4, 1, 1},
		{4, 1, 4.0 / 3, (1.0 / 3) / (1 + 1.0/3)}, // burst 1: an M/D/1/1 loss, ρ/(1+ρ)
	} {
		if got := PoissonRefused(c.rate, c.burst, c.arrivals); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("PoissonRefused(%g, %g, %g) = %g, want %g", c.rate, c.burst, c.arrivals, got, c.want)
		}
	}
	// A huge burst is bounded work and errs over.
	if got := PoissonRefused(1e6, 1e9, 9e5); got < 0 || got > 1e-3 {
		t.Errorf("PoissonRefused of a burst of 1e9 = %g", got)
	}
	// More burst never refuses more.
	prev := 1.0
	for b := 1.0; b <= 30; b += 0.25 {
		got := PoissonRefused(6, b, 5)
		if got > prev+1e-9 {
			t.Fatalf("burst %g refuses %g, more than %g at a smaller burst", b, got, prev)
		}
		prev = got
	}
}

func BenchmarkPoissonRefused(b *testing.B) {
	for range b.N {
		PoissonRefused(4.0/3, 4.0/3, 2.0/3)
	}
}

func TestPoissonRefusedOverflow(t *testing.T) {
	// ρ = 2 over a burst of 4,096: F overflows; the figure is the rate's, 1 − 1/ρ.
	if got := PoissonRefused(100, 4096, 200); math.Abs(got-0.5) > 1e-6 {
		t.Errorf("PoissonRefused(100, 4096, 200) = %g, want 0.5", got)
	}
}
