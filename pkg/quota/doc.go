// Package quota counts calendar quotas (rules.CalendarQuota: "10,000 a day per key") in
// batches: a check is answered from memory, and a background flusher adds the counts to
// each identity's counter in Redis every Config.Flush.
//
// # How a check is decided
//
// The Table keeps, per (identity, quota) in the current period, the last total it
// learned from the counter (known), the counts it admitted since (pending) and those in
// a batch on the wire (syncing). A check of cost c is admitted when
//
//	known + pending + syncing + c ≤ quota − View.Others(identity, quota, period start)
//
// and then adds c to pending; a refusal adds nothing, and a check refused later by
// another rule gives its c back (Table.Cancel). The limit is read from the rules at
// every check, so raising a quota mid-period admits at once and lowering it below the
// usage refuses at once: the counter is usage, not a budget.
//
// Every Flush, the flusher sends one batch (one pipeline, split by shard): for each entry
// with counts pending, or checked within Config.Keep, one script call that adds pending
// (INCRBY, 0 for a refresh), raises the counter to known + pending when it holds less,
// and answers the new total — which becomes known, so each enforcer learns the others'
// counts. The first check of a key in a period on an enforcer reads the counter once
// (one call, that check only); the checks after it cost no Redis call.
//
// # Which way it errs, and by how much
//
// Over, near exhaustion: an enforcer does not see the others' counts until its next
// refresh. With N enforcers admitting a key at r requests a second in all, counts not
// yet seen by one enforcer are at most those of the last two batches (its refresh's
// and the others' flush), so a period ends at most about N × r × 2 × Flush over the
// quota when every enforcer spends its last margin at once — in practice N × r_i × Flush
// each (r_i an enforcer's own rate). 2 s batches at 10 requests a second over 3
// enforcers: up to about 60 requests over a day's 10,000.
//
// Under: a check refused by a later rule gives its count back, but one refused between a
// batch and the next refresh reads the others' counts late: none. A lost answer to a
// batch (the add done, the reply lost) is added again: counted twice, refusing early.
//
// Durability. The counter lives in Redis. With persistence (appendonly yes, appendfsync
// everysec, as the chart ships) a crash loses at most a second of counts; a failover the
// replication lag. Beyond that, every batch raises the counter to the enforcer's last
// known total + its pending counts (max, not sum: never counted twice), so a counter
// that restarted empty mid-period is restored at the next batch of any enforcer that
// used the key, up to what they had seen: what is lost is at most the counts that no
// enforcer had yet learned, one refresh's worth (under: admits more).
//
// Redis outage. A batch that fails keeps its counts pending (tried again every Flush),
// and an entry whose last batch failed is unsynced: a fail-closed rule refuses while
// its key is unsynced, a fail-open one counts locally against the total it last knew
// and flushes when Redis answers again. A key first seen during an outage has no known
// total: it is counted from zero on each enforcer (over, by what the key had used
// before); while only some shards are down, its first check waits for the read once, at
// most Config.ReadTimeout. Leases (pkg/lease) do not apply: the batch is the quota's own lease.
//
// Memory. The table holds at most Config.MaxEntries entries; an entry idle for
// Config.Keep with nothing pending is dropped at a flush, and a new key on a full table
// evicts the least recently checked of a few sampled, whose pending counts are sent in
// the next batch first. Those waiting counts are bounded the same way: filling up wakes
// the flusher at once, and past the bound a count is dropped and counted in Table.Lost
// (under), which only a client evicting more keys with counts than the table holds within
// one batch can cause. A client inventing keys grows nothing past the bound.
package quota
