// Package share is the balancer's allocation policy: pure functions from usage reports to
// each region's share of one limited identity's global limit. No I/O, no clock, no
// goroutines, no state beyond what the caller passes in; every function is safe for
// concurrent use. The model is youtube/doorman's algorithm.go: the policy a pure function,
// its formula below, and its invariant asserted at every step of table and fuzz tests.
//
// # Guarantees
//
// For any input (bad input is clamped, see # Bad input), the shares Allocate returns are
// each ≥ 0 and sum to ≤ 1 (in region order, in float64); regions with Held get exactly
// Held (when Σ Held ≤ 1); every free region gets at least Floor when floors fit
// (Floor × free regions ≤ 1 − Σ Held), else an equal part of what Held leaves; every
// free region gets at least its smoothed demand (less at most DeadBand/4 the dead-band
// may hold back) when the demands fit in what Held leaves, else its max-min fair part; unchanged demand gives bit-identical shares after
// finitely many intervals and never flaps (both fuzzed). Step
// keeps Σ_q max(mayApply[q], next[q]) ≤ 1, so the sum stays ≤ 1 while a change is being
// applied, whichever regions have applied it. Which way it errs: under. A region short of
// share is refused until the next recompute; capacity is never handed out twice.
//
// # The formula
//
// Per identity, per interval, with L the global limit (tokens/s), regions r = 1..n, d_r
// this interval's demand (admitted + refused, tokens/s; NaN = not heard), s_r the smoothed
// demand, p_r the previous shares (the Default split for a fresh State):
//
//  1. Fast path. A free region is short when d_r/L > p_r + DeadBand: it is refused and
//     asks for more than a dead-band beyond its share. A free region's demand collapsed
//     when d_q ≤ s_q/2 and s_q − d_q ≥ DeadBand/4 × L. When any region is short, or one
//     is refused at all (d_r/L > p_r) while another's demand collapsed, every heard
//     region's smoothed demand is set to its demand, s_r := d_r: the traffic moved, so
//     believe the newest report, and a shift is one recompute, not several EWMA steps
//     (nor several pushes of a share released half at a time).
//
//  2. Smoothing otherwise (nobody short: every region has about what it asks for):
//
//     s_r := s_r + Alpha × (d_r − s_r)
//
//     and s_r := d_r once within 0.1% of d_r, so the EWMA lands on constant demand
//     exactly instead of creeping toward it forever. Demand falling to zero decays
//     geometrically; the shares drift toward the default split (step 4) and stop being
//     published once what is left of the drift is inside the dead-band. (The balancer's
//     TTL returns an identity that left the reports to the default split itself.)
//
//     A region not heard (NaN) keeps s_r; the first interval starts at s_r := d_r.
//
//  3. Max-min fair water-filling. Free capacity F = 1 − Σ Held over the m free regions;
//     floor f = min(Floor, F/m); claim c_r = max(f, s_r/L). Visit the free regions by
//     claim, smallest first; with C capacity left for k regions, region r gets
//     min(c_r, C/k), and C decreases by it. This is the unique max-min fair split of F
//     with lower bound f: there is a level λ with share_r = min(c_r, λ), and every region
//     under the level gets all it claims.
//
//     Over the limit (Σ s_r/L > F) with Noise, a region whose claim is met claims
//     max(s_r − MetCut·√v_r, 0)/L instead, and the split is filled again: every token
//     it may not use goes to the refused regions, which surely use it (a region of 15/s,
//     read at 20 ± 3 a second after a move, kept 17/s at one deviation: 2/s its refused
//     region lacked, and the move took 6 s). Which way it errs: the met region is
//     refused up to MetCut standard deviations of its demand's estimate more than
//     max-min fairness gives it, where the refused regions admit what it gives up.
//
//  4. Slack. When every claim is met (Σ c_r < F), the rest S = F − Σ c_r first tops
//     each free region up to its demand plus its headroom, u_r = min(w_r + z·√s_r / L, 1)
//     with z = Headroom: every region by what it lacks (u_r − c_r) when S covers it all,
//     else in proportion to it. What is left, S', is handed out by the default split over
//     the free regions: share_r = c_r + top-up_r + S' × D_r, with D_r = Default_r /
//     Σ_free Default (equal if the default gives the free regions nothing).
//
//     Why headroom. A token bucket admits Poisson arrivals at rate λ only with room over
//     λ: at a rate of 2/s and a burst of 2 it refuses an eighth of 1.5/s. √s_r tokens/s
//     is one standard deviation of a second's arrivals, so z = 2 leaves a region about
//     two of them. It matters for small keys: 1.5/s from one region under a 3/s limit got
//     0.67 of the limit by the default split (2/s, a burst of 2: steady_ratio 0.88) and
//     gets 0.98 now (1.03); a key of hundreds a second gets a few percent. A key over its
//     limit has no slack, so nothing changes there.
//
//     Why the default split for the rest, and not demand. Both keep every claim met, so
//     steady-state admission is the same. They differ in where the headroom sits until
//     the next recompute. By demand, the busiest region gets nearly all of it (one region
//     at 90%: 98%, others at the 1% floor), and the split follows the ratio of the demands
//     even when they are tiny: a key using 3% of its limit swings its whole slack from one
//     region to another as two small demands decay, a publication each time, and an
//     identity whose demand fell to zero stays pinned to where it last was. By the default
//     split, the shares move only as much as the demand does, an idle identity (no
//     demand, no headroom) drifts to its default split, and an idle region keeps a reserve
//     in proportion to the slack, which absorbs traffic that moves there better than the
//     1% floor would. A region that outgrows its share is short and takes the fast path
//     at the next recompute.
//
//  5. Held regions get exactly Held; a guard takes the last ulp off the largest free share
//     if rounding left Σ above 1.
//
//  6. Dead-band. The previous shares p stand when they are still valid for this input
//     (Held regions at Held, free ones ≥ f, Σ ≤ 1) and every region's target t_r is
//     within DeadBand of p_r (and always when within 10⁻⁹, so rounding never
//     publishes) — except that a region that wants more than it has (s_r/L > p_r) and
//     would gain at least DeadBand/4 is always pushed. So small wobbles are not
//     published, yet a region held below what it wants loses at most DeadBand/4 of the
//     limit to the dead-band. With slack, a region whose share is more than DeadBand
//     under its need (demand plus headroom, step 4, at most what one region can hold
//     beside the others' floors; the demand taken two standard deviations of its
//     estimate low, so one noisy window is not a need) while its target covers its need
//     u_r is pushed too, by
//     DeadBand/4 or more, taking only what the other regions hold above their own
//     targets and needs (topUp): the noise band is about the demand, and a target in the
//     slack often does not follow the demand (a 5/s key offered 2.25/s in one region
//     was kept at its first seconds' 0.76 for a whole run while its target was 0.98).
//
// # Defaults and why
//
// Floor 0.01 (fixed, not a reserve that decays for idle regions). With a key offered at
// or above its limit in one of three regions, the busy region gets 1 − 2 × 0.01 = 98% of
// the limit (under its limit, every region gets at least its demand anyway);
// with the dead-band's worst case (DeadBand/4 = 0.5%) that is ≥ 97.5% steady state, above
// the 97% target. A decaying reserve would win at most those 2% back, at the price of a
// counter per region in State and of serving less at once when traffic appears in a region
// idle for long, which is what the floor is for. With n regions the busy one gets
// 1 − (n − 1) × Floor: for five regions, choose Floor ≈ 0.0075.
//
// Alpha 0.5. Without the fast path, after a full shift (all demand from region A to B)
// B's smoothed demand after k intervals is 1 − (1 − Alpha)^k of it:
//
//	Alpha            0.3   0.5   0.7   0.8   0.95   1
//	intervals to 95%   9     5     3     2     1    1
//
// so pure EWMA at any real smoothing misses "back to 95% within 15 s" at a 10 s interval.
// The fast path (step 1) makes a shift independent of Alpha: the first recompute whose
// report shows the new region refused moves it to the reported demand at once (a report
// that straddles the shift moves it part of the way, the next one the rest). Alpha only
// smooths while every region has what it asks for, where it decides how the shares follow
// wobbles; 0.5 halves a wobble each interval and settles within a few.
//
// The 15 s target is then a matter of when the balancer recomputes: a shift seen in an
// early report (sent ≥ 2 s after refusals jump) and recomputed at once is published
// within a few seconds, its increase after the decreases are acknowledged (≈ 1 s). With
// recomputes only every 10 s, a shift in the middle of an interval is seen half-way in
// the first report (region B at about half of its new demand) and fully in the second:
// up to 20 s. So the balancer should recompute an identity on an early report.
//
// DeadBand 0.02: moves under 2% of the limit are not worth a write and a change plan; a
// region short of what it wants is still pushed at 0.5% (step 6). It is also the margin
// of "short" in step 1, so a region at its share with a few refusals (bursts) does not
// switch the smoothing off.
//
// # Worked example
//
// Limit 1000/s, three regions, DefaultConfig with Headroom 0 (the slack by the default
// split alone; with the default Headroom 2, interval 1's slack of 0.1 first tops the
// regions up by 2√500, 2√300 and 2√100 of 1000 — 0.045, 0.035, 0.020 — and the last
// 0.0007 goes by the default split), Default (0.5, 0.3, 0.2), nothing Held.
//
// Interval 1, fresh State (p = the default split), demand (500, 300, 100): nobody short
// (0.5 < 0.5 + 0.02, ...), first interval so s = (500, 300, 100). Claims (0.5, 0.3, 0.1)
// sum to 0.9 < 1, slack S = 0.1 goes 0.5 : 0.3 : 0.2 = (0.05, 0.03, 0.02): shares
// (0.55, 0.33, 0.12). Region 2 moved 0.08 ≥ DeadBand: pushed.
//
// Interval 2, demand (560, 280, 60). Nobody short (0.56 < 0.55 + 0.02), no collapse
// (60 > 100/2): EWMA, s = (500 + ½·60, 300 − ½·20, 100 − ½·40) = (530, 290, 80). Claims
// (0.53, 0.29, 0.08), S = 0.1: shares (0.58, 0.32, 0.10). Region 0 moved 0.03: pushed.
//
// Interval 3, demand (540, 290, 70): s = (535, 290, 75), target (0.585, 0.32, 0.095).
// Every region moved < 0.02 and region 0 has more than it wants (0.535 < 0.58): the
// dead-band keeps (0.58, 0.32, 0.10); nothing to publish.
//
// Interval 4, the traffic moves to region 2: demand (0, 100, 1200). Region 2 wants 1.2 >
// 0.10 + 0.02: fast path, s = (0, 100, 1200). Claims (0.01, 0.1, 1.2) sum above 1, so
// water-filling: region 0 gets min(0.01, 1/3) = 0.01 (0.99 left), region 1 min(0.1, 0.495)
// = 0.1 (0.89 left), region 2 min(1.2, 0.89) = 0.89: shares (0.01, 0.1, 0.89).
//
// The change plan from (0.58, 0.32, 0.10) to it: Step gives (0.01, 0.1, 0.10) — both
// decreases at once, region 2 waits (Σ max(old, next) = 0.58 + 0.32 + 0.10 = 1, no
// headroom). Once regions 0 and 1 acknowledged that version, Step((0.01, 0.1, 0.10),
// target) = (0.01, 0.1, 0.89), done.
//
// Interval 5, the same demand (0, 100, 1200): region 2 is still short (1.2 > 0.89 + 0.02,
// it is refused above its share), so the fast path runs, but s is already the demand: the
// target is the same and nothing is pushed. A key over its limit thus keeps following
// the newest report, which is right for it, and stands still when its demand does.
// TestWorkedExample holds these numbers; Example and ExampleStep run them.
//
// # Change plan
//
// Only usage reports acknowledge a decrease: an increase waits until every enforcer of
// the regions being decreased has reported applying the decrease. The balancer keeps, per
// identity and region, mayApply[r]: the highest share region r may be enforcing — the
// maximum of the shares in r's last version acknowledged by every enforcer of r (reports
// carry the applied version) and in every version published since. Then, each time it has
// a new target (from Allocate) or new acknowledgements:
//
//  1. next, done := Step(mayApply, target); publish next as a new version.
//  2. For every region, mayApply[r] = max(mayApply[r], next[r]) until every enforcer of r
//     has reported applying that version (or a later one); then mayApply[r] = next[r].
//     Time never acknowledges, nor does the write landing in etcd: it says nothing about
//     an enforcer cut off from etcd.
//  3. If not done, call Step again with the new mayApply when the acknowledgements come
//     in (a new target from Allocate simply replaces the old one: Step is stateless).
//
// An enforcer that stops reporting holds its region's acknowledgement until it has fenced
// itself — the balancer's Stale + AckTimeout after its last report, when by its own
// staleness rule it enforces at most min(last, default) — or has left with a final
// report. A region that cannot acknowledge (silent) keeps its old mayApply; Allocate
// gives it exactly Held, so it is not decreased while silent and blocks nothing it is not
// holding. Once its enforcers have fenced themselves it enforces at most
// min(last, default) on its own; the balancer may then set mayApply[r] to that without an
// acknowledgement. A new leader that does not know what is applied must assume the most
// (the persisted shares, or 1 for an unknown region): Step then only decreases until
// acknowledgements arrive.
//
// # Noise
//
// Demand is counted over windows of Poisson arrivals, so a key that is steady is not
// steady in its reports: 15/s counted over 10 s is 15 ± 1.2. A key over its limit is short
// at every interval, and its fast path would replace the smoothed demand with each noisy
// count and push the change (TestNoiseIsNotRepublished: 160 of 190 intervals
// republished). Input.Noise gives each region's standard deviation σ_r (√tokens / T), and
// State.Var carries the variance v_r of each smoothed demand as an estimate: σ_r² when the
// demand replaces it, (1 − a)²·v_r + a²·σ_r² after an EWMA step of weight a, unchanged when
// the region was not heard. The step's weight is a = max(α, v_r/(v_r + σ_r²)): a reading
// more precise than the smoothed demand weighs as much as its precision says (after the
// fast path took one second's count, the next window's average replaces most of that
// second's noise at once, TestPreciseReadingWeighsMore); in the steady state v_r ≈ σ_r²/3
// and a = α. A reading within three deviations of the smoothed demand (√(v_r + the
// reading's variance at the larger of the two rates)) has α replaced by min(α,
// max(SteadyDrift·√N, 0.05)) for a window of N tokens: a small key's window is mostly
// Poisson noise, and at α its smoothed demand kept 0.6 of a window's deviation (0.4 now,
// TestASmallSteadyKeysDemandWandersLess); from 100 tokens a window the weight is α. Then:
//   - the fast path also needs |d_r − s_r| > 3·√(σ_r² + v_r) (the demand moved, not only
//     exceeds the share), where a reading under the smoothed demand has the variance its
//     count would have at s_r (a short window's low count is no more precise than the
//     demand it is tested against: read at its own count, a 3/s key's empty second was
//     three deviations under 3/s, TestShortWindowsEmptySecondIsNotACollapse);
//   - a collapse is any free region's demand moving either way by more than that and
//     DeadBand/4 of the limit (without Noise, only a fall to half or less counts): the
//     smoothed demand it would leave a wanting region is stale;
//   - the dead-band widens to 3·√(Σ v_r) / L over the regions whose claim is met (w_r ≤
//     t_r): a region asking for more than the level gets the level whatever its noise.
//     Not on the fast path: the demand moved by more than its noise. Nor for a small key
//     whose demand drifted: when the slack is short of the regions' headroom and a region
//     whose headroom is at least its demand (s_r < z², 4/s at Headroom 2) has a smoothed
//     demand more than DriftSigmas·√v_r from State.Basis (the smoothed demand the shares
//     were last computed from), the band is DeadBand alone. Such a key's target follows
//     its demand at a fraction (the headroom is most of what each region asks), so the
//     band on the target held targets its first noisy seconds gave long after its demand
//     had moved.
//
// Input.Fast takes the fast path whatever the noise: the caller (the balancer's shift
// detection) knows the traffic moved and gives the rate since it did.
//
// In the test, 0 of 190 intervals republished, the 15/s region at 0.297 of a 50/s limit
// (max-min fair: 0.30). Which way it errs: a region may be held up to the widened
// dead-band below its max-min fair share until its demand moves by more than three
// standard deviations; for keys of hundreds a second the widening is under the dead-band
// and changes nothing. nil Noise is the policy above, unchanged.
//
// # Bad input
//
// AllocateChecked and StepChecked return an error (wrapping ErrConfig or ErrInput, naming
// the field and value). Allocate and Step never panic and clamp instead: an invalid
// Config field is forced into range (Alpha to 1); a Limit that is not finite and > 0
// leaves the demand unusable (the default split is allocated, smoothing still runs); a
// negative or infinite demand counts as not heard; Default entries are clamped to
// [0, 1] and scaled to sum 1 if they sum above; Held is clamped to [0, 1] and, if it
// sums above 1, scaled to sum 1 (the free regions then get 0); a State whose slices have
// the wrong length starts fresh; missing Default and Held entries count as 0 and NaN.
package share
