package share

import "math"

const (
	// maxStack regions are computed in stack scratch; more use the heap (one allocation).
	maxStack = 8
	// settle: an EWMA within this fraction of the demand it follows is set to it, so
	// unchanged demand gives bit-identical shares after finitely many intervals.
	// (Demand falling to zero is not snapped: every region decays by the same factor, so
	// the split stands until the balancer's TTL returns an idle identity to its default.)
	settle = 1e-3
	// minMove: a move smaller than this is never a change, whatever DeadBand, so float
	// rounding cannot make unchanged demand publish.
	minMove = 1e-9
	// maxFraction caps a demand as a fraction of the limit (a million limits is
	// "unbounded" for the water-filling and keeps every sum finite).
	maxFraction = 1e6
	// floorTolerance: a previous share this far under the floor still counts as at it
	// (the Σ ≤ 1 guard may have taken an ulp off a share sitting at the floor).
	floorTolerance = 1e-12
)

// SettleAllocations is how many allocations after a fast path follow the demand without
// the noise band: the refinements of a move (a follow-up and a recompute or two), each
// reading a longer stretch than the one second the move was read from. It bounds what a
// move costs in versions beyond the move's own: at most this many, each one moving some
// region by DeadBand/4 (a wanting one) or DeadBand.
const SettleAllocations = 3

// MetCut is how many standard deviations of its demand's estimate a region whose claim
// is met gives up while the identity is over its limit (package doc, step 3): what it may
// not use goes to the regions that are refused, which surely do. Over many-keys' seeds
// 1–40 (960 moves; docs/design.md §9) one standard deviation left 71 moves over 3 s and
// 25 over 5 s; two left 51 and 5 (three: 58 and 4), the met region of a key over its
// limit being refused 2√(d/30) of its demand d in the steady state (1.5/s of 15/s).
const MetCut = 2

// DriftSigmas is how far, in standard deviations of its estimate, a smoothed demand may
// drift from the demand the shares were last computed from (State.Basis) before the
// noise band stops holding a small key: one whose slack is short of its regions'
// headroom, in a region whose headroom (2√s) is at least its demand (package doc, step
// 6). Such a key's target moves much less than its demand, so a band on the target held
// targets set from the key's first noisy seconds long after the demand had moved: a 4/s
// key offered 1.7/s and 0.62/s was held at (0.47, 0.51) for 52 s while its smoothed
// demands went from (0.47, 0.53) to (1.65, 0.68). In the 10,000-key population's first two
// minutes, keys failing steady_ratio that their split reference does not fail 232 → 182,
// bytes to etcd +6% (three deviations: 141, +9%, but a steady key of that kind was
// republished in 7% of its intervals, the wander of its smoothed demand about the basis;
// four: 1%). Over many-keys' seeds, whose keys are larger, nothing changes.
const DriftSigmas = 4

// SteadyDrift is how much, as a fraction of itself, a steady demand is taken to wander
// from one window to the next, next to the Poisson noise of the window's count: while a
// reading is within steadySigmas standard deviations of the smoothed demand (package doc,
// # Noise), its weight is at most SteadyDrift·√N for a window of N tokens (s/σ = √N), and
// at least minSteadyWeight. A count of N tokens is 1/√N noisy, so a small key's window is
// mostly noise: at Alpha alone its smoothed demand kept 0.6 of a window's deviation (the
// 10,000-key population's k06850, 1.3/s in a region, sat at 0.73 after a run of low
// windows, and its shares with it); at 0.05·√13 ≈ 0.18, 0.4
// (TestASmallSteadyKeysDemandWandersLess). A key of 10/s or more in a region (100 tokens a
// 10 s window) keeps Alpha. In the population, keys failing steady_ratio that their split
// reference passes 159 → 119 and recovery 572 → 571 (0.03 and two deviations: 105, but 606, a
// new key's first windows followed too slowly); many-keys over 100 seeds, moves over 3 s
// 118 → 126 and over 5 s 12 → 12.
// Which way it errs: a small key whose demand really changes by less than steadySigmas
// of a window's noise follows it over about 1/weight windows (five for 1.3/s) instead of
// two — under, in the region whose demand rose.
const SteadyDrift = 0.05

const (
	// steadySigmas: a reading further than this many standard deviations of the
	// difference from the smoothed demand (√(v + the reading's noise at the larger of the
	// two, countNoise)) is a change, weighed at Alpha.
	steadySigmas = 3
	// minSteadyWeight bounds a steady reading's weight below (a key of a token or two a
	// window).
	minSteadyWeight = 0.05
)

// countNoise is the variance of a window's reading had the rate been x: the window's
// length T from the reading d and its noise σ (Poisson: d = N/T, σ = √N/T, so T = d/σ²;
// 1/σ for a count of nothing), and x/T. Judged at the larger of the reading and the
// smoothed demand, a low count is not more precise than the rate it is compared with.
func countNoise(d, nz, x float64) float64 {
	t := 1 / nz
	if d > 0 {
		t = d / (nz * nz)
	}
	return max(x/t, nz*nz)
}

// Allocate computes the identity's next target shares. It returns the new State; the
// target is State.Shares (new slices; st is not modified).
//
// Guarantees (fuzzed): every share ≥ 0; Σ ≤ 1 (summed in region order); each free
// region ≥ Floor where floors fit in what Held leaves; Held regions get exactly Held
// (when Σ Held ≤ 1); unchanged demand gives unchanged shares after finitely many
// intervals and never flaps.
//
// Allocate does not fail: input it cannot use is clamped as documented in the package
// doc (# Bad input). AllocateChecked reports it instead.
func Allocate(cfg Config, st State, in Input) State {
	next, _ := AllocateInto(State{}, cfg, st, in)
	return next
}

// AllocateChecked is Allocate after cfg.Validate and a check of in and st (slice lengths,
// Limit finite and > 0, Demand NaN or ≥ 0, Default and Held in range and summing ≤ 1,
// Floor × regions ≤ 1). The error wraps ErrConfig or ErrInput and names the field and
// value.
func AllocateChecked(cfg Config, st State, in Input) (State, error) {
	if err := cfg.Validate(); err != nil {
		return State{}, err
	}
	if err := in.check(cfg, st); err != nil {
		return State{}, err
	}
	return Allocate(cfg, st, in), nil
}

// AllocateInto is Allocate writing into dst's slices when they have the capacity (dst may
// be st itself: st is read in full before anything is written). With up to 8 regions and
// dst's slices of capacity ≥ regions it does not allocate. dst's slices are overwritten:
// do not pass as dst a State whose Shares are still needed elsewhere (e.g. held in a
// published set). changed reports whether the new Shares differ from the previous ones
// (st.Shares, or Input.Default for a fresh State), i.e. whether there is something to
// publish; when false, Shares are bit-identical to the previous ones.
//
// A new leader restoring persisted shares passes State{Shares: persisted}: the previous
// shares are then the persisted ones and smoothing starts from the first demand.
func AllocateInto(dst State, cfg Config, st State, in Input) (next State, changed bool) {
	cfg = cfg.clamped()
	n := len(in.Demand)
	var stack [11 * maxStack]float64
	var sc []float64
	if n <= maxStack {
		sc = stack[:11*n]
	} else {
		sc = make([]float64, 11*n)
	}
	raw, prev, sm, held := sc[:n], sc[n:2*n], sc[2*n:3*n], sc[3*n:4*n]
	def, w, t, vr, hr, tgt, cw := sc[4*n:5*n], sc[5*n:6*n], sc[6*n:7*n], sc[7*n:8*n], sc[8*n:9*n], sc[9*n:10*n], sc[10*n:]

	// Inputs, sanitized (package doc, # Bad input).
	limitOK := in.Limit > 0 && !math.IsInf(in.Limit, 1)
	perLimit := 1 / in.Limit // a multiplication is cheaper than a division, 1M times over
	var defSum float64
	for r := 0; r < n; r++ {
		d := math.NaN()
		if v := in.Demand[r]; v >= 0 && !math.IsInf(v, 1) {
			d = v
		}
		raw[r] = d
		h := math.NaN()
		if r < len(in.Held) && !math.IsNaN(in.Held[r]) {
			h = min(max(in.Held[r], 0), 1)
		}
		held[r] = h
		def[r] = 0
		if r < len(in.Default) && in.Default[r] > 0 {
			def[r] = min(in.Default[r], 1)
		}
		defSum += def[r]
	}
	if defSum > 1 {
		for r := range def {
			def[r] /= defSum
		}
	}
	if len(st.Shares) != n { // fresh: the enforcers apply the default split
		copy(prev, def)
	} else {
		copy(prev, st.Shares)
	}
	havePrevSmoothed := len(st.Smoothed) == n

	// The previous smoothed demand (NaN: none usable) and its variance (0: none known).
	havePrevVar := len(st.Var) == n
	for r := 0; r < n; r++ {
		sm[r] = math.NaN()
		if havePrevSmoothed {
			if v := st.Smoothed[r]; v >= 0 && !math.IsInf(v, 1) {
				sm[r] = v
			}
		}
		vr[r] = 0
		if havePrevVar {
			if v := st.Var[r]; v > 0 && !math.IsInf(v, 1) {
				vr[r] = v
			}
		}
	}

	// Fast path (package doc, step 1): some free region is short (asks for more than
	// DeadBand over its share), or one is refused at all while another's demand
	// collapsed (fell to half its smoothed demand or less, releasing ≥ DeadBand/4).
	// With Input.Noise the demand must also have moved from the smoothed demand by more
	// than three standard deviations of the difference (the demand's noise and the
	// smoothed demand's): a key steadily over its limit is short at every interval, and
	// its noisy demand would otherwise replace the smoothed one each time.
	fast := in.Fast && limitOK
	if limitOK && !fast {
		wanting, collapsed := false, false
		for r := 0; r < n; r++ {
			if !math.IsNaN(held[r]) || math.IsNaN(raw[r]) {
				continue
			}
			// The reading's variance at the larger of it and the smoothed demand, as the
			// steady test has it: a reading under s_r is tested at the rate it would have if
			// nothing had moved. Read at its own count, a 3/s key's empty second (one second
			// in twenty) was three deviations under its smoothed demand, a collapse, and the
			// fast path handed its share to the other regions' noisy seconds (the 10,000-key
			// population recomputes every second or two while its busy keys move: k00925,
			// 12/s offered 3/s in each region, was given 0.01 in one). With no smoothed
			// demand sd is NaN and unused: moved holds, and no collapse is read.
			sd := 3 * math.Sqrt(countNoise(raw[r], noiseOf(in.Noise, r), max(raw[r], sm[r]))+vr[r])
			w := raw[r] * perLimit
			moved := math.IsNaN(sm[r]) || math.Abs(raw[r]-sm[r]) > sd
			fast = fast || (w > prev[r]+cfg.DeadBand && moved)
			wanting = wanting || w > prev[r]
			// Another region's demand collapsed (fell to half its smoothed demand or less,
			// releasing ≥ DeadBand/4) or, where the noise is known, moved either way by
			// more than three standard deviations and DeadBand/4 of the limit: the smoothed
			// demand it would leave a wanting region is stale (a swap of 240/s and 60/s
			// took 30 s of halvings). Without a noise estimate only a collapse is evidence.
			if s := sm[r]; !math.IsNaN(s) && math.Abs(s-raw[r])*perLimit >= cfg.DeadBand/4 && math.Abs(s-raw[r]) > sd &&
				(raw[r] <= s/2 || sd > 0) {
				collapsed = true
			}
		}
		fast = fast || wanting && collapsed
	}

	// Smoothed demand: s' = s + α(d − s), or d itself on the fast path, on the first
	// interval, or within `settle` of d; a region not heard keeps s.
	// Its variance follows: v' = (1−α)² v + α² noise², noise² when the demand replaces
	// it, unchanged when the region was not heard.
	for r := 0; r < n; r++ {
		s, d := sm[r], raw[r]
		nz := noiseOf(in.Noise, r)
		switch {
		case math.IsNaN(d):
			if math.IsNaN(s) {
				s = 0
			}
		case math.IsNaN(s) || fast:
			s = d
			vr[r] = nz * nz
		default:
			// A reading more precise than the smoothed demand weighs more: the weight is at
			// least α, and the inverse-variance weight v/(v + noise²) when that is larger
			// (after the fast path took one second's count, a window's average is several
			// times more precise; at α alone the second's noise stayed in the demand, and in
			// the noise band, for three intervals). In the steady state v ≈ noise²/3 and
			// the weight is α.
			a := cfg.Alpha
			if r < len(in.Weight) && in.Weight[r] > 0 && in.Weight[r] <= 1 {
				a = in.Weight[r]
			}
			if hi := max(s, d); nz > 0 && s > 0 && math.Abs(d-s) <= steadySigmas*math.Sqrt(vr[r]+countNoise(d, nz, hi)) {
				a = min(a, max(SteadyDrift*hi/nz, minSteadyWeight)) // a steady small key (SteadyDrift)
			}
			if nz > 0 && vr[r] > 0 {
				a = max(a, vr[r]/(vr[r]+nz*nz))
			}
			s += a * (d - s)
			vr[r] = (1-a)*(1-a)*vr[r] + a*a*nz*nz
			if math.Abs(d-s) <= settle*max(d, s) {
				s = d
			}
		}
		sm[r] = s
	}

	// Free capacity F = 1 − Σ Held (Held scaled down to sum 1 if it sums above).
	var heldSum float64
	m := 0
	for r := 0; r < n; r++ {
		if math.IsNaN(held[r]) {
			m++
		} else {
			heldSum += held[r]
		}
	}
	free := max(1-heldSum, 0)
	if heldSum > 1 {
		for r := range held {
			if !math.IsNaN(held[r]) {
				held[r] /= heldSum
			}
		}
	}

	// Demand of the free regions as a fraction of the limit (0 when the limit is
	// unusable), and the default split over the free regions, normalized to sum 1 (equal
	// if the default gives them nothing): the weights of the slack.
	// hr: the headroom each free region's demand wants on top (step 4), a fraction.
	var wSum, dSum float64
	for r := 0; r < n; r++ {
		w[r], hr[r] = 0, 0
		if math.IsNaN(held[r]) {
			if limitOK {
				w[r] = min(sm[r]*perLimit, maxFraction)
				wSum += w[r]
				hr[r] = min(cfg.Headroom*math.Sqrt(sm[r])*perLimit, 1)
			}
			dSum += def[r]
		}
	}
	perDefault := 1 / dSum
	for r := 0; r < n; r++ {
		switch {
		case !math.IsNaN(held[r]):
			def[r] = 0
		case dSum > 0:
			def[r] *= perDefault
		default:
			def[r] = 1 / float64(m)
		}
	}

	floor := 0.0
	if m > 0 {
		floor = min(cfg.Floor, free/float64(m))
	}
	waterFill(t, w, def, hr, held, free, floor)
	if limitOK && wSum > free {
		// Over the limit, every share is used where it goes: the regions whose claims
		// were met claim their demand less MetCut standard deviations of its estimate,
		// and the refused regions share the rest. Which way it errs: a met region is
		// refused that much more — in the steady state 2√(d/30) for a demand d read over
		// 10 s windows (9% of 15/s, 2% of 300/s), twice a second's noise (2√d) just
		// after a move, where its full claim, read 1.2σ high, held a
		// 50/s key's refused region 10% of the limit short for 10 s. A token moved to a
		// refused region is admitted; one left with a met region only if its traffic is
		// that much higher than read. Regions at the level (all refused) keep equal parts.
		cut := false
		for r := 0; r < n; r++ {
			if math.IsNaN(held[r]) && w[r] > 0 && w[r] <= t[r]+minMove && vr[r] > 0 {
				cw[r] = max(w[r]-MetCut*math.Sqrt(vr[r])*perLimit, 0)
				cut = true
			} else {
				cw[r] = w[r]
			}
		}
		if cut {
			// The cut claims are the claims from here on: the dead-band counts a cut
			// region as met (its noise widens the band) and not as wanting more.
			copy(w, cw)
			waterFill(t, w, def, hr, held, free, floor)
		}
	}
	for r := 0; r < n; r++ {
		if !math.IsNaN(held[r]) {
			t[r] = held[r]
		}
	}
	fitSum(t, held)

	// Dead-band: keep the previous shares when they are still a valid answer and the
	// target moved no region by DeadBand or more — unless a region that wants more than
	// it has would gain DeadBand/4.
	keep := prevValid(prev, held, floor)
	band, gain := max(cfg.DeadBand, minMove), max(cfg.DeadBand/4, minMove)
	// Only the regions whose claim was met carry their noise into the targets: a region
	// that asks for more than the level gets the level, whatever its demand's noise (a
	// key over its limit in one region and under in another was held 30 s off its fair
	// split by the big region's noise).
	var varSum float64
	for r := 0; r < n; r++ {
		if math.IsNaN(held[r]) && w[r] <= t[r]+minMove {
			varSum += vr[r]
		}
	}
	// A small key's target follows its demand at a fraction (each region's headroom is
	// most of what it asks, and the slack is short of them all): its demand drifting
	// from the basis of its shares by more than DriftSigmas of its noise is a move the
	// band must not hold. Keys with slack to spare, and keys over their limit, have
	// targets that follow their demands one for one: the band on the target is theirs.
	drifted := limitOK && wSum <= free && len(st.Basis) == n && smallKeyDrifted(st.Basis, sm, vr, w, hr, held, floor, free)
	if varSum > 0 && limitOK && !fast && st.Settling <= 0 && !drifted {
		// Three standard deviations of the met regions' smoothed demands: a target moved
		// by less is noise, not a move. Which way it errs: a region may be held that much
		// below its max-min fair share. Not on the fast path: the demand moved by more
		// than its noise, and the move is what the targets follow. Nor for the
		// SettleAllocations after it: the fast path read one second (a region of 15/s
		// ± 4), and three of its standard deviations held a 50/s key's wanting region
		// 13/s under its fair part until some 14 s of windows had narrowed the band (a
		// swap of 60/s and 15/s recovered in 14 s; with the refinements, 2–4 s).
		tol := 3 * math.Sqrt(varSum) * perLimit
		band, gain = max(band, tol), max(gain, tol)
	}
	for r := 0; keep && r < n; r++ {
		delta := t[r] - prev[r]
		if math.Abs(delta) >= band || (wSum > 0 && math.IsNaN(held[r]) && w[r] > prev[r] && delta >= gain) {
			keep = false
		}
	}
	if keep {
		copy(tgt, t)
		copy(t, prev)
		if limitOK {
			topUp(t, tgt, w, hr, held, sm, vr, perLimit, free, floor, max(cfg.DeadBand/4, minMove), max(cfg.DeadBand, minMove))
		}
	}
	for r := 0; r < n; r++ {
		if t[r] != prev[r] {
			changed = true
			break
		}
	}

	next.Settling = 0
	if fast {
		next.Settling = SettleAllocations
	} else if st.Settling > 0 {
		next.Settling = st.Settling - 1
	}
	if changed || len(st.Basis) != n {
		next.Basis = append(dst.Basis[:0], sm...)
	} else {
		next.Basis = append(dst.Basis[:0], st.Basis...)
	}
	next.Smoothed = append(dst.Smoothed[:0], sm...)
	next.Shares = append(dst.Shares[:0], t...)
	next.Var = append(dst.Var[:0], vr...)
	return next, changed
}

// smallKeyDrifted reports whether a small key's demand has drifted from the basis of its
// shares (see DriftSigmas): the free regions' needs (claim plus headroom) exceed the free
// capacity, and some free region whose headroom is at least its demand has a smoothed
// demand more than DriftSigmas of its standard deviations from its basis.
func smallKeyDrifted(basis, sm, vr, w, hr, held []float64, floor, free float64) bool {
	var need float64
	for r := range w {
		if math.IsNaN(held[r]) {
			need += min(max(w[r], floor)+hr[r], 1)
		}
	}
	if need <= free {
		return false
	}
	for r, b := range basis {
		small := math.IsNaN(held[r]) && w[r] > 0 && hr[r] >= w[r]
		if small && b >= 0 && vr[r] > 0 && math.Abs(sm[r]-b) > DriftSigmas*math.Sqrt(vr[r]) {
			return true
		}
	}
	return false
}

// waterFill writes into t the max-min fair split of the free capacity among the free
// regions (held[r] not NaN are skipped), each region's claim being c[r] = max(floor,
// w[r]) (package doc, steps 3 and 4):
//
//	visit the free regions by claim, smallest first; with C capacity left for k regions,
//	the region gets min(c[r], C/k);
//	any capacity left once every claim is met (slack) first tops each region up to
//	w[r] + hr[r] (its headroom; in proportion to what each lacks when the slack is
//	short), and the rest is added by the weights d[r] (the default split over the free
//	regions, summing to 1).
func waterFill(t, w, d, hr, held []float64, capacity, floor float64) {
	n := len(t)
	var stack [maxStack]int
	var idx []int
	if n <= maxStack {
		idx = stack[:0]
	} else {
		idx = make([]int, 0, n)
	}
	for r := 0; r < n; r++ {
		t[r] = 0
		if !math.IsNaN(held[r]) {
			continue
		}
		// Insertion sort by claim: n is the number of regions, a handful.
		c := max(floor, w[r])
		i := len(idx)
		idx = append(idx, r)
		for i > 0 && max(floor, w[idx[i-1]]) > c {
			idx[i] = idx[i-1]
			i--
		}
		idx[i] = r
	}
	// Claims in ascending order: while a claim fits the even part of what is left it is
	// met; the first that does not fixes the level (left/k), and every later (larger)
	// claim gets the same level, since giving left/k to one of k leaves the same level
	// for the other k − 1. One division per identity instead of one per region.
	left := capacity
	for k, r := range idx {
		c, rest := max(floor, w[r]), float64(len(idx)-k)
		if c*rest <= left {
			t[r] = c
			left = max(left-c, 0)
			continue
		}
		level := left / rest
		for _, q := range idx[k:] {
			t[q] = level
		}
		left = 0
		break
	}
	if left > 0 {
		var lack float64
		for _, r := range idx {
			lack += max(min(w[r]+hr[r], 1)-t[r], 0)
		}
		if lack > 0 {
			give := min(left, lack)
			for _, r := range idx {
				t[r] += give * (max(min(w[r]+hr[r], 1)-t[r], 0) / lack)
			}
			left = max(left-give, 0)
		}
		for _, r := range idx {
			t[r] += left * d[r]
		}
	}
	for _, r := range idx {
		t[r] = max(t[r], floor)
	}
}

// fitSum makes Σ t ≤ 1 (summed in index order) where rounding left it an ulp or so above,
// by lowering the largest free share (held[r] NaN), or the largest share if none is free.
func fitSum(t, held []float64) {
	s := sum(t)
	if s <= 1 {
		return
	}
	j := -1
	for r := range t {
		if math.IsNaN(held[r]) && (j < 0 || t[r] > t[j]) {
			j = r
		}
	}
	if j < 0 || t[j] == 0 {
		j = 0
		for r := range t {
			if t[r] > t[j] {
				j = r
			}
		}
	}
	t[j] = max(t[j]-(s-1), 0)
	for i := 0; i < 64 && t[j] > 0 && sum(t) > 1; i++ {
		t[j] = math.Nextafter(t[j], 0)
	}
	if s = sum(t); s > 1 { // not reached with sane input; stays correct with any
		for r := range t {
			t[r] *= (1 - 1e-9) / s
		}
	}
}

// prevValid reports whether the previous shares are still an answer the policy could
// give: Held regions exactly at Held, free ones at the floor or above, Σ ≤ 1.
func prevValid(prev, held []float64, floor float64) bool {
	for r, p := range prev {
		if !(p >= 0 && p <= 1) {
			return false
		}
		if math.IsNaN(held[r]) {
			if p < floor-floorTolerance {
				return false
			}
		} else if p != held[r] {
			return false
		}
	}
	return sum(prev) <= 1
}

func sum(x []float64) float64 {
	var s float64
	for _, v := range x {
		s += v
	}
	return s
}

// noiseOf is noise[r] when it is finite and > 0, else 0.
func noiseOf(noise []float64, r int) float64 {
	if r < len(noise) {
		if v := noise[r]; v > 0 && !math.IsInf(v, 1) {
			return v
		}
	}
	return 0
}

// topUp pushes, inside the dead-band, the free regions whose share is under their demand
// plus headroom (package doc, step 6) toward their targets, taking only what the others
// hold above their own targets and headroom (and what no region holds), so it moves no
// other region under what it needs. p is the kept shares (changed in place), t the
// targets.
//
// Why. A region short of headroom refuses a part of its Poisson arrivals (step 4), and
// the noise band is about the demand, while a target in the slack often does not follow
// the demand at all: a 5/s key offered 2.25/s from one region was kept at the 0.76 its
// first seconds gave (3 requests of burst after quantise, 7% of its traffic refused) for
// the whole run, its demand's 3σ being 30% of the limit while its target stayed at 0.98.
// Only a region whose target covers its need is pushed (its need is then met, so the
// push does not repeat on noise until the need reaches a new high), and by taking only
// surplus no region is made short by it (pushing whole targets made two regions take
// turns, a version each).
//
// A region is short by its demand's lower bound (sm − 2√v): one noisy window (a 48/s key
// read at 80/s over less than half a second) is not a need.
//
// Which way it errs: a region whose target does not cover its need (the slack too short
// for every region's headroom) stays with the dead-band's answer, within the band.
func topUp(p, t, w, hr, held, sm, vr []float64, perLimit, free, floor, gain, short0 float64) {
	n := len(p)
	m := 0
	used := 0.0
	for r := 0; r < n; r++ {
		if math.IsNaN(held[r]) {
			m++
			used += p[r]
		}
	}
	claims := 0.0
	for r := 0; r < n; r++ {
		if math.IsNaN(held[r]) {
			claims += max(floor, w[r])
		}
	}
	if m == 0 || claims >= free-minMove {
		return // no slack: every share is a claim, and the band is the noise's
	}
	most := free - float64(m-1)*floor // the most one free region can hold
	need := func(r int) float64 { return min(w[r]+hr[r], most) }
	short := func(r int) bool {
		// Short by the demand's lower bound (two standard deviations of the smoothed
		// demand under it): one noisy short window (80/s read of a 48/s key) is not a
		// need.
		lo := min(max(sm[r]-2*math.Sqrt(vr[r]), 0)*perLimit+hr[r], most)
		return math.IsNaN(held[r]) && t[r] >= need(r)-minMove && p[r] < lo-short0 && t[r]-p[r] >= gain
	}
	want, spare := 0.0, max(free-used, 0)
	for r := 0; r < n; r++ {
		switch {
		case short(r):
			want += t[r] - p[r]
		case math.IsNaN(held[r]):
			spare += max(p[r]-max(t[r], need(r), floor), 0)
		}
	}
	if want < gain || spare < gain {
		return
	}
	f := min(spare/want, 1)
	take := want * f
	fromUnused := min(max(free-used, 0), take)
	surplus := spare - max(free-used, 0)
	cut := 0.0
	if surplus > 0 {
		cut = (take - fromUnused) / surplus
	}
	for r := 0; r < n; r++ {
		switch {
		case short(r):
			p[r] += (t[r] - p[r]) * f
		case math.IsNaN(held[r]):
			p[r] -= max(p[r]-max(t[r], need(r), floor), 0) * cut
		}
	}
	fitSum(p, held)
}
