package sim

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/allot-dev/allot/pkg/sim/scenario"
)

// stream is the Poisson arrivals of one key in one region. Its rate is piecewise constant
// (the key's phases); the next arrival after t is found by drawing u ~ Exp(1) and walking
// the phases until the integral of the rate from t reaches u, which is exact for a
// piecewise-constant rate (memorylessness makes resampling at a phase change unnecessary).
// Each stream has its own generator seeded from (scenario seed, key, region), so adding a
// key does not change the traffic of the others.
//
// A stream is read at every arrival of its key, and 10,000 keys' streams miss the cache:
// its generator and its phases (at, rate and split's, in inl for a key of one phase) are
// kept in or beside it rather than in five allocations of their own.
type stream struct {
	key, region int
	rng         rand.Rand // over pcg
	pcg         rand.PCG
	at          []float64 // phase starts, seconds
	rate        []float64 // offered requests/s from at[i]
	end         float64   // the run's end, seconds
	t           float64   // the next arrival, seconds; +Inf when none
	next        int64     // the next arrival, ns since Epoch
	split       splitBucket
	inl         [4]float64 // at, rate, split.rate and split.burst of a key of one phase
}

// splitBucket is the reference the judge's steady_split reads (KeyResult.SteadySplit): the
// key's bucket split between the regions in proportion to what each is offered in the
// phase in force (rate × w_r, burst × w_r, w_r = offered_r ÷ Σ offered), fed the same
// arrivals as the region. It is what a split that follows the traffic exactly admits, so
// a key whose steady_split is low is refused by splitting its burst, not by where its
// shares are.
type splitBucket struct {
	rate, burst []float64 // per phase
	tokens      float64
	last        float64 // seconds
}

// take is one arrival at t (seconds) in phase i: true if the split bucket admits it.
func (b *splitBucket) take(t float64, i int) bool {
	if i < 0 || b.burst[i] < 1 {
		b.last = t
		return false
	}
	b.tokens = min(b.burst[i], b.tokens+(t-b.last)*b.rate[i])
	b.last = t
	if b.tokens >= 1-1e-9 { // float error: 1/3 + 0.5 × 4/3 is 0.999…
		b.tokens = max(b.tokens-1, 0)
		return true
	}
	return false
}

// phase is the index of the phase in force at t (-1 before the first).
func (s *stream) phase(t float64) int {
	i := -1
	for j, a := range s.at {
		if a <= t {
			i = j
		}
	}
	return i
}

func newStream(sc *scenario.Scenario, k, r int) *stream {
	key := &sc.Keys[k]
	s := &stream{key: k, region: r, end: sc.Duration.Seconds()}
	s.pcg.Seed(uint64(sc.Seed), uint64(k)<<16|uint64(r))
	s.rng = *rand.New(&s.pcg)
	n := len(key.Phases)
	buf := s.inl[:]
	if 4*n > len(buf) {
		buf = make([]float64, 4*n)
	}
	s.at, s.rate, s.split.rate, s.split.burst = buf[:0:n], buf[n:n:2*n], buf[2*n:2*n:3*n], buf[3*n:3*n:4*n]
	for _, p := range key.Phases {
		s.at = append(s.at, p.At.Seconds())
		s.rate = append(s.rate, p.Offered[r])
		total := 0.0
		for _, o := range p.Offered {
			total += o
		}
		w := 0.0
		if total > 0 {
			w = p.Offered[r] / total
		}
		s.split.rate = append(s.split.rate, key.Limit.PerSecond()*w)
		s.split.burst = append(s.split.burst, key.Limit.Burst*w)
	}
	if len(s.split.burst) > 0 {
		s.split.tokens = s.split.burst[0]
	}
	s.t = 0
	s.advance()
	return s
}

// advance draws the next arrival after s.t.
func (s *stream) advance() {
	u := s.rng.ExpFloat64()
	t := s.t
	for {
		i := -1 // the phase in force at t
		for j, a := range s.at {
			if a <= t {
				i = j
			}
		}
		change := s.end
		if i+1 < len(s.at) {
			change = s.at[i+1]
		}
		if i >= 0 && s.rate[i] > 0 {
			if dt := u / s.rate[i]; t+dt < change {
				s.setT(t + dt)
				return
			}
			u -= (change - t) * s.rate[i]
		}
		if change >= s.end {
			s.setT(math.Inf(1))
			return
		}
		t = change
	}
}

func (s *stream) setT(t float64) {
	s.t = t
	if math.IsInf(t, 1) {
		s.next = math.MaxInt64
		return
	}
	s.next = int64(t * float64(time.Second))
}

// streamHeap orders streams by their next arrival (ties: key, then region). Each slot
// carries the order's fields beside the stream, so that sifting compares within the
// heap's own array: with 10,000 streams a region, loading each stream compared missed the
// cache (a tenth of a long-tail run went to the heap).
type streamHeap []streamSlot

type streamSlot struct {
	next        int64 // s.next when the slot was last fixed
	key, region int32
	s           *stream
}

func slotOf(s *stream) streamSlot {
	return streamSlot{next: s.next, key: int32(s.key), region: int32(s.region), s: s}
}

// push appends s; init orders the heap once every stream was pushed.
func (h *streamHeap) push(s *stream) { *h = append(*h, slotOf(s)) }

// top is the stream whose arrival is next.
func (h streamHeap) top() *stream { return h[0].s }

// advanced restores the heap after the top stream drew its next arrival.
func (h streamHeap) advanced() {
	h[0].next = h[0].s.next
	h.down(0)
}

func (h streamHeap) less(i, j int) bool {
	a, b := &h[i], &h[j]
	if a.next != b.next {
		return a.next < b.next
	}
	if a.key != b.key {
		return a.key < b.key
	}
	return a.region < b.region
}

func (h streamHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

// down restores the heap after h[i] moved later.
func (h streamHeap) down(i int) {
	n := len(h)
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && h.less(l, m) {
			m = l
		}
		if r < n && h.less(r, m) {
			m = r
		}
		if m == i {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}
