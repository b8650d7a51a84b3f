package bucket

import "math"

// PoissonRefused is the fraction of a Poisson stream of arrivals (arrivals a second, each
// wanting one token) that a bucket of rate tokens a second holding up to burst refuses in
// the long run. It is what a burst cut between regions costs a key that is under its
// limit: one bucket of 4/s, burst 4, offered 2/s refuses 0.8% of it; three of 4/3 each,
// offered 2/3 each, refuse 26% (docs/design.md §9, "Slack and the long tail").
//
// The bucket is an M/D/1 queue in disguise: its deficit (burst − tokens) / rate is the
// time it needs to fill, which falls at one second a second and rises by 1/rate on each
// admitted arrival, and an arrival is admitted while that time is at most
// K = (burst − 1) / rate. Below K the deficit's distribution is the unlimited queue's, whose
// distribution function F (its atom at 0 taken as 1) solves
// F'(x) = arrivals · (F(x) − F(x − 1/rate)); time spent filling equals the work admitted, so
// the refused fraction is 1 − F(K) / (1 + ρ·F(K)), ρ = arrivals / rate, for any ρ. F is
// integrated on a grid of 1/(64·rate) (Heun's method; its terms are all positive, where
// the closed form's alternating sum loses every digit past bursts of about twenty).
// Accuracy: within 1e-4 of the closed form where that is exact (TestPoissonRefused), and
// of a simulated bucket within its sampling error.
//
// A burst under one token refuses everything (1); no arrivals refuse nothing (0). Bursts
// past maxPoissonBurst tokens are taken as that many (a bucket that large refuses a Poisson
// stream under its rate too rarely to matter, and the grid's cost grows with the burst),
// which errs over: the figure is then at least the true one.
func PoissonRefused(rate, burst, arrivals float64) float64 {
	switch {
	case !(arrivals > 0) || math.IsInf(arrivals, 0):
		if math.IsInf(arrivals, 1) {
			return 1
		}
		return 0
	case !(burst >= 1) || !(rate > 0):
		return 1
	}
	burst = min(burst, maxPoissonBurst)
	d := 1 / rate                // the time one token takes to refill
	k := (burst - 1) / rate      // the largest deficit (in seconds) that still admits
	const perToken = 64          // grid steps per token's refill time
	h := d / perToken            // the grid step
	n := int(math.Ceil(k/h)) + 1 // grid points 0..n−1 cover [0, K]
	f := make([]float64, n)      // F on the grid
	// lag is F(x − d) over the step from point i−1 to point i, at its start (from the
	// right) and at its end (from the left): F jumps by its atom at 0, so the step that
	// ends at x = d still lags 0 at its end, and the one that starts there lags the atom.
	lag := func(i int, end bool) float64 {
		j := i - perToken
		if j < 0 || end && j == 0 {
			return 0
		}
		return f[j]
	}
	f[0] = 1
	for i := 1; i < n; i++ {
		// Heun: the slope at i−1, a trial step, the slope at i, their mean.
		s0 := arrivals * (f[i-1] - lag(i-1, false))
		trial := f[i-1] + h*s0
		s1 := arrivals * (trial - lag(i, true))
		f[i] = f[i-1] + h*(s0+s1)/2
	}
	fk := f[n-1] // K itself lies between the last two points: interpolate
	if n > 1 {
		x := k/h - float64(n-2)
		fk = f[n-2] + (f[n-1]-f[n-2])*x
	}
	// 1 − F/(1 + ρF), written so that an F grown past float range (ρ > 1, a long burst)
	// gives its limit, 1 − 1/ρ; clamped against rounding.
	return min(max(1-1/(1/fk+arrivals/rate), 0), 1)
}

// maxPoissonBurst bounds PoissonRefused's grid: 64 points a token.
const maxPoissonBurst = 4096
