// Package fallback keeps a Redis outage from becoming an API outage (docs/design.md §7, promise
// P2), without loosening limits when Redis is healthy and this process is merely slow.
// Store is a bucket.Store decorator, the outermost layer of an enforcer
// (fallback → lease → redis).
//
// Two clocks, kept apart:
//
//   - A check waits Config.Timeout (5 ms) for the next store. That wait is about this
//     check: if it passes, this one check is answered locally, and nothing is concluded
//     about the shard.
//   - The call itself runs on a goroutine of the Store, under its own deadline,
//     Config.ReplyTimeout (100 ms), which go-redis puts on the socket. A check that
//     stops waiting does not cut the call short, so a slow moment of this process never
//     costs a connection (go-redis drops a connection whose read timed out).
//
// Each Redis shard has a circuit breaker, and only evidence about the shard moves it:
//
//   - a call's reply closes the run of errors (and, as a probe, the breaker);
//   - TripAfter consecutive errors from the shard (refused or reset connections, cluster
//     errors) open it;
//   - a call with no reply within ReplyTimeout opens it at once, unless the shard
//     answered after it was sent (it is alive), or this process was not running
//     meanwhile: the timeout was seen more than ReplyTimeout/2 late, or the Store's stall
//     meter (a 5 ms ticker, see meter) saw a gap over ReplyTimeout/4 since the call was
//     sent; the reply may then be sitting unread in the socket;
//   - and only if another shard answered a call sent after it: a shard silent while its
//     peers answer is the shard's fault. When every shard went quiet together it is more
//     likely this process or its machine (a loaded host starving the reads of every
//     connection at once), so the breaker waits until no shard has answered for
//     Config.AllSilentFor (500 ms) before it opens;
//   - while open no check calls the shard; then exactly one probe does. The first wait is
//     FirstOpenFor (250 ms), doubled after each failed probe up to OpenFor (2 s): a shard
//     that only missed replies for a moment is back on shared counts quickly, a dead one
//     costs one probe every 2 s.
//
// So a paused or dead master trips ReplyTimeout after the first call it does not answer
// (≈ 100 ms) while the other masters answer, a whole cluster down (or a shard whose peers
// have no traffic) in about AllSilentFor (≈ 500 ms), and a stall of this process (GC, a
// loaded 2-core VM: 20–30 ms, sometimes 200 ms) opens nothing: the replies of the calls it delayed arrive late and count as
// replies, and a reply missing across a stall proves nothing.
//
// While a shard's breaker is not closed, or a check's wait passed, the check is answered
// locally at limit × Slack / N, N the enforcers in the region, from a bounded in-memory
// bucket table; a request of a rule marked fail-closed is not answered but returned as
// bucket.ErrUnavailable with the wait until the shard is next tried (pkg/enforcer refuses
// it: the one place the fail mode is decided). A check whose wait passed keeps waiting while
// the shard has answered some call within the last ReplyTimeout/2, or when the wait ended
// late (this process was not running): under load, replies later than Timeout are still
// used rather than replaced by local answers. Every local answer is reported with its
// reason (Observer.Local: open breaker, the wait passed, the call failed, the in-flight
// bound); the first of a run whose wait passed on a closed breaker, the only kind a
// healthy cluster can cause, is also logged at warn.
//
// A next store that can answer from memory (Cache: pkg/lease's leased tokens and refusal
// cache) is asked first, on the checking goroutine, with no goroutine, timer or
// allocation; such answers say nothing about the shard.
//
// Which way it errs (docs/design.md §10): local limits err over. With traffic spread evenly over
// N enforcers a key is held near Slack × its limit (default 2×); traffic concentrated on
// fewer enforcers is held lower. A fail-closed rule errs under: it refuses everything on an
// unavailable shard. A check answered locally because its wait passed, whose call then
// succeeds, took its tokens from Redis without spending them (and spent local ones): that
// errs under for the shared limit, by at most the request's Want per such check; the
// answer itself is the local one (over, as above, for that one check).
//
// In-flight slots (inflight.go) and settlements of costs known after the response
// (settle.go) pass through the same breakers: while a shard is down a settlement of a
// check's handle is refused (its marker is in Redis; the estimate stands unless it is
// sent again once the shard is back) and one without a handle (Envoy's stream-done and
// negative hits) is applied to the local limits.
//
// Bounds: at most MaxInFlight calls per shard are in flight (each lives at most
// ReplyTimeout, or ProbeTimeout); a check finding its shard at the bound is answered
// locally. Every call runs on a goroutine the Store owns, and so does the stall meter
// (real clock only); Close cancels them and waits.
//
// The deadline only reaches the socket if the go-redis client is made with
// ContextTimeoutEnabled: true; otherwise it waits its own ReadTimeout on a dead shard.
package fallback
