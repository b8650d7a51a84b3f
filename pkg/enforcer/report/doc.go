// Package report is the enforcer's side of the balancer's usage reports: a bounded table
// of the tokens each limited identity — a (rule id, identity) pair — was admitted and
// refused this interval (Table, an enforcer.UsageObserver), and the goroutine that sends
// a report of it to the balancer's leader every interval (Reporter).
//
// # Counting in bounded memory
//
// The table holds at most Config.Capacity pairs whatever the number of identities
// clients invent (promise P7). It is split into S = Config.Stripes stripes by a hash of
// the identity; each stripe is a weighted Space-Saving table of m = Capacity/S pairs,
// refilled from empty every interval. A stripe that sees a pair it does not track while
// full evicts its pair of least count c_min and gives the newcomer the error c_min. Per
// tracked pair the table keeps admitted and refused, the exact tokens since the pair was
// (last) inserted, and err, that inherited c_min; its count is admitted + refused + err.
//
// The bounds, for a stripe that observed N_s tokens this interval (the standard
// Space-Saving argument: counts only grow and every eviction replaces the minimum c_min by
// c_min + w, so the counts sum to N_s once the stripe is full, c_min never decreases, and
// an untracked pair's true tokens are at most the c_min it was evicted at):
//
//   - Which way it errs: under. A reported admitted (refused) is at most the pair's true
//     admitted (refused) tokens this interval, and the true demand lies in
//     [admitted + refused, admitted + refused + error], error being err: exactly the
//     reading of IdentityUsage.error in balancer.proto.
//   - How far: error ≤ c_min ≤ N_s / m. A pair inserted before its stripe filled has
//     error 0 (exact).
//   - Who is tracked: every pair whose true tokens this interval exceed N_s / m is in the
//     table at the end of the interval. With the identities spread evenly N_s ≈ N/S and
//     the bound is ≈ N / Capacity; the guarantee is per stripe.
//
// A pair under pressure is reported if it is tracked, and pressure does not protect it
// from eviction: a pair refused a few tokens in a stripe churned by many others can be
// lost, and then the balancer does not hear of it that interval. Its share stays where it
// was (the balancer's TTL brings an unheard key back to the default split), which errs
// under the pair's want, never over the global limit.
//
// # Reports
//
// Table.Report drains the interval (the busiest pairs by volume and every pressured pair,
// up to Config.MaxIdentities; see Report). RegionalRate, the hook that tells pressure,
// runs only there, never on the check path.
//
// An early report is wanted (Table.WantEarly) when some pair's refused tokens this
// interval exceed both Config.EarlyMinRefused and Config.EarlyFactor × its refused tokens
// last interval scaled to one whole Config.Interval — a pair that starts being refused, or
// whose refusals at least double — and Config.EarlyGap has passed since the last report.
// (For a pair refused little the threshold is its last interval's refusals plus four
// Poisson standard deviations and earlyJump, when that is under EarlyMinRefused.) From a
// second into the interval the same test is also made against the part of the interval
// that has passed, last interval's refusals scaled to it: a move is found within about a
// second rather than when a whole interval's worth has been refused. The test costs the
// check path one comparison while a pair's refusals are under earlyJump (the whole-interval
// threshold is fixed when the pair is inserted), and a little arithmetic per refusal above
// it (BenchmarkObserveRefused).
//
// Each entry also says whether the region is spending its burst: a take in the span its
// recent rate counts left the region's bucket under half its burst (ObserveTake's low;
// the enforcer says so for a burst of enforcer.DrainMinBurst tokens or more), reported
// as IdentityUsage.draining. The balancer reads a key under its limit so reported as
// arrived before its region refuses anything.
//
// # Sending
//
// The Reporter sends each report to the leader the LeaderSource names (etcd: the first
// key created under the election prefix, as concurrency.Election.Leader reads it), follows
// at most MaxRedirects redirects from standbys, and on failure retries once at once with
// the same seq (re-resolving the leader first). A report whose retry fails too is dropped:
// the next interval's report is drained and sent on its own, so nothing is ever queued
// (memory: the table and at most one report in flight). Dropping errs safe: the balancer
// treats a region it has not heard from as still holding its last share. The check path
// never waits for any of this: ObserveTake touches the table only.
//
// With ReporterConfig.Addrs (a region that reaches the balancer replicas through its own
// proxy or load balancer) no LeaderSource is asked: each attempt goes round the listed
// addresses once, from the one that last accepted, past errors and standbys; a standby's
// redirect is followed only to an address of the list.
package report
