// Package lease is the layer that keeps busy keys off Redis: a bucket.Store decorator that
// takes tokens from the next store in batches, spends them from memory, and remembers
// refusals until the next store said to retry.
//
// # Guarantees
//
// Never over: every token this layer grants was taken from the next store first, under the
// same limits, less than LeaseTTL earlier (QuietTTL for a quiet lease), but for the one
// check per lapse that the lapsed check (below) answers from a lot that has just expired,
// within the tokens held. From any start the
// fleet of enforcers therefore admits no more than the bucket gave; within one window it
// may admit, on top of what the bucket gives in that window, the tokens the fleet held
// when it began (bounded below: "Quiet keys"). It errs under, in these bounded ways:
//
//   - Tokens leased but not spent (at most about 1.5 batches per key per enforcer) are
//     stranded until they expire or are dropped (limits changed, key evicted).
//   - A lowered limit bites at the key's next check: a lease taken under other limits is
//     dropped then (tokens it held count as limits-changed).
//   - A refused key is refused from memory until the retry time the next store gave,
//     counted from when the call was sent, so the cache expires at or before the store's
//     own retry time (as the store rounded it: up, to the µs). The cache is also primed
//     when a grant leaves the bucket empty (see entry.observe): only while the bucket
//     provably cannot give the tokens. Neither refuses what the store would grant (barring
//     a store that loses its state, e.g. a Redis failover).
//   - A contended key — a lease call got less than the batch it asked for — is paced: no
//     call before about Window/2 (see pace), and checks that find the lease empty until
//     then are refused from memory although the bucket may have gathered a few tokens.
//     Those tokens wait in the bucket for the next call; they are lost only if the bucket
//     fills meanwhile (a burst under ~100 ms of the rate). This is what keeps a key offered
//     at or above its limit at a few calls per hundred admitted checks instead of one call
//     per token or two. While checks keep being refused so, the call after the pace goes
//     in the background and the checks in its round trip are refused from memory too, so
//     no check for such a key waits on the next store (see pace).
//
// # Batch size
//
// An enforcer is one of N in its region (Config.Peers) and the limits it is given are the
// region's. With Config.ID, N for a key is the count of enforcers that serve it when fewer:
// each call for the key sights it in the next store at most once per Config.SightEvery
// (bucket.Request.Sight), and the store answers how many enforcers did so within
// Config.SightTTL; a count older than SightTTL is not believed (Store.Seen, which
// pkg/fallback sizes its local limits by). Over a window W (Config.Window, 100 ms) the region may admit rate × W tokens of
// a limit, and this enforcer's even part is rate × W / N. For a request of cost c:
//
//	byRate = ⌊ min over the request's limits of rate × W / N ⌋
//	batch  = min(byRate, 2 × d)           d: tokens this enforcer was asked for the key in
//	                                        the current window or the last one (whichever
//	                                        is more), so a lease never covers more than
//	                                        about two windows of the key's local demand
//	batch  = max(batch, c)                 a batch always serves the check in hand
//	batch  = min(batch, ⌊ min burst ⌋)     and never exceeds what a bucket can hold
//
// A key is leased with this batch when it is busy — this enforcer saw at least
// Config.BusyHits checks for it within one window (or a check arrived while a call for it
// was in flight) — and batch > c; or with the quiet batch below (the larger of the two
// when both apply); or, on its first check, with the opening lot below. Otherwise every
// check is the exact per-request call: a key with few checks and no whole lease TTL of
// history, or near its limit, costs one call per check and gets exact answers. The busy
// criterion errs toward exactness: a key just under the threshold pays one call per check
// rather than stranding a batch it would not spend.
//
// # Quiet keys
//
// A key seen less than BusyHits times a window would cost one call per check, and most
// keys of a real population are such keys (a Zipf tail seen a few times a second or
// less). A key far below its limits instead leases a batch sized to its own demand over
// one QuietTTL (Q, Config.QuietTTL, 2 min), whose tokens may be spent for Q:
//
//	prev  = tokens this enforcer was asked for the key over the last whole Q
//	a, t  = tokens asked so far in the current Q, and for how long it has run
//	crit  = max(prev, a × Q / max(t, T))          the demand over Q, erring high
//	size  = max(prev, a × Q / (t + T))            the demand over Q, erring low
//	quiet batch = min(size, ⌊ R × T / (4 × N) ⌋, ⌊ min burst ⌋)
//	              when 4 × N × crit ≤ R × Q, and prev ≥ 2c or (t ≥ T and a ≥ 2c)
//
// with R the slowest rate of the request's limits, T = LeaseTTL and N the enforcers in
// the region. A key needs at least a LeaseTTL of history with two checks for it, so one
// seen for the first time is leased its demand a second or two later, its batch growing
// toward its demand over Q as the period fills. It is refilled at half, like a busy
// lease, so in steady state it costs one call per batch: one per Q for a key under the
// cap, instead of one per check. A quiet key seldom spends half its batch, so its lot
// usually expires first; the key's next check is then the lapsed check below, and the
// refill it makes due goes in the background.
//
// The opening lot. A key's first check here (nothing asked of this enforcer for it over
// the current Q and the one before) is the quiet batch of a key whose demand over Q is
// two checks: crit = size = 2c, so Want = 2c (Min = c) when 2c fits the cap above, under
// QuietTTL. Its second check is then spent from memory; if that check comes a LeaseTTL or
// more after the first, the key's demand is known and the lot is refilled in the
// background with its quiet batch, so a key of the tail waits on the store once, not on
// its first two checks. A second check within a
// LeaseTTL does not refill it (the demand is still a guess: the next check calls, as it
// did without the lot), and a lot granted only in part does not pace the key. It errs
// like a quiet lease, within its bounds: each enforcer strands at most c tokens of a key
// it saw once, for at most Q, and a key's first window may admit c more per enforcer. It
// costs no call: the first check called anyway.
//
// The lapsed check. A lot expires unspent when its key does not come back within the
// lot's life: a quiet key seen every minute or two, a client polling on a timer, a busy key
// that paused. The check that finds its key's lease so would wait on a call to the next
// store. Instead it spends its own cost (Request.MinGrant) from the lot that has just
// expired; the rest of the lot is dropped as expired, and the refill that an empty lease
// makes due goes in the background (when the key is still worth a lease), so the key's
// next checks are answered from that. A key that comes back, at any period, then waits on
// the store only when it is new here or its demand no longer earns a lease. It applies only
// when the key holds nothing else and was last seen neither refused (the refusal cache),
// paced nor contended: a key at or over its limit gets no token taken long ago. A change
// of limits drops the lease before it is looked at (refresh), so none is spent under other
// limits. See keepLapsed.
//
// Which way it errs, and by how much. Under, never over in total: tokens are still taken
// before they are spent. The criterion keeps the fleet's demand for the key at or under
// R/4 (measured over Q). Each enforcer holds at most about 1.5 quiet batches, so the fleet
// holds at most 1.5 × N × R × T/(4N) = 0.375 × R × T tokens of the key (375 tokens for a
// 1,000/s limit): the cap is what a quiet lease of one LeaseTTL could hold, so the longer
// life changes how long those tokens can stay stranded (up to Q), not how many.
//   - Under: a key whose traffic moves to other enforcers, or jumps from under R/4 to
//     its limit, finds its bucket short by at most the tokens the fleet holds
//     (≤ 0.375 × R × T), until they are spent or expire (≤ Q). At steady demand they
//     cannot cause a refusal: the bucket is drawn at most 2.5 × R/4 < R.
//   - Over, in a window only: tokens taken before a window and spent in it are admitted
//     in the window on top of what the bucket gives then, so a key jumping from quiet
//     to far over its limit may see, in its first window, up to the tokens held
//     (≤ 0.375 × R × T) above burst + rate × window; never over across the key's life.
//     A busy lease has the same property with its smaller batch (the fleet holds at most
//     1.5 × R × Window of a busy key: 150 tokens for 1,000/s).
//   - The lapsed check: its token was taken before it is spent, but it is spent after its
//     lot's TTL, by as long as the key was away. It is one of the tokens that enforcer held
//     (what expired), so the window bound above holds as it is: a key back from a pause
//     to far over its limit may see, in its first window, one check more per enforcer
//     than the bucket alone gives then, once per lapse, and only if that enforcer last saw
//     the key uncontended. No more tokens are held for it: the token is spent instead
//     of dropped.
//
// As a key's measured demand grows past R/(4N) per enforcer the quiet batch is withdrawn
// and the busy batch (a 1/N share of one Window of R, and at most two windows of local
// demand, under LeaseTTL) applies, which is small near the limit. A limit changed by a rule
// or a share drops the lease at the key's next check, whatever its TTL.
//
// The lease is refilled in the background when it falls to half a batch or less (and the
// key is not paced or refused), so a busy key does not wait on the next store. Calls ask
// Want = batch, Min = c: a partial grant still serves. At most one call per key is in
// flight; checks that miss meanwhile wait for it and share its answer (or its error).
//
// Measured against a real 3-master Redis Cluster (integration_test.go): one key limited to
// 1,000/s offered at or above its limit through 3 enforcers costs 0.03–0.06 Redis calls
// per admitted check; a retry storm at 100× the limit costs at most about one call per
// retry interval per enforcer.
//
// # Penalties
//
// A request with a bucket.Penalty (a rule's penalty for abuse) has its refusals from
// memory — the refusal cache and pacing — counted per key (not while the key is blocked),
// and the count handed to the next store with the key's next call, foreground or refill
// (bucket.Request.Refused; given back if the call fails), so the store counts the key's
// refusals across the region's enforcers. An answer that the key is blocked
// (bucket.Result.Penalized) drops the tokens leased for it and primes the refusal cache
// until the block's end: the key is then refused from memory, without a call, and those
// answers say Penalized. Which way it errs: the store hears of a refusal up to one
// refusal-cache interval after it was answered (the block begins that much late, and a
// window may count refusals that much older than it), refusals still counted here when
// a client stops are never handed over, and this enforcer learns of a block others
// started at its next call for the key. A request without a penalty costs one nil test.
//
// # Where answers come from
//
// Result.Source is bucket.SourceLease for checks spent from leased tokens,
// bucket.SourceRefusalCache for refusals from memory, and the next store's own Source for
// checks that called it.
//
// # Settlements
//
// Settlements of costs known after the response (bucket.Settler, settle.go) are not
// leased: they go to the next store, where the leased tokens came from. A debt there
// stops the key's next lease call; tokens already leased are spent (over, by at most
// those: about 1.5 batches an enforcer). A refund does not lift a refusal cached before
// it (under, until that retry time).
package lease
