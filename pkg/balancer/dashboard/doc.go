// Package dashboard is the balancer's share-drift dashboard: server-rendered HTML with
// inline SVG, no external asset (it works offline), reloading itself every Refresh.
//
// The overview (Prefix/) shows the leader's term and share set version, each region's
// reports, share age, acknowledged version and drift (max over identities of |published
// share − demand fraction| at each recompute, over the history), and for the top
// identities by demand their global limit, admitted and refused rates, a bar of where
// each region's share sits against a bar of where the demand is, and both over time
// (share solid, demand fraction dashed, one colour per region). Prefix/identity shows one
// identity: rule, global limit, per region the default, published and target share, the
// allowance (share × limit), demand, admitted and refused, the version the region is
// known to apply (and whether that includes this identity's newest share), and its share,
// allowance vs demand and refusals over time when it was in the top. On a standby the
// pages say so and name the leader (its report address and term from the election)
// instead of showing stale data as current.
//
// # Who sees identities
//
// Identities are customers' API keys and addresses: only a viewer with a token of
// Config.Viewers (the admin tokens, read-only dashboard tokens) sees them; everyone else
// sees each masked as its kind and a keyed hash, and a wrong token is 401 (viewer.go).
//
// # Where the data comes from
//
// What the balancer decides comes from the Core, copied out under its mutex and rendered
// after (Core.Stats, Core.Identity, Core.Top): pages never render under it. Admitted and
// refused counts, which the Core does not keep apart, come from the accepted reports
// themselves (Tap, History.Observe): per region, and per identity for the last sample's
// top only. They are for reading: a retried report the Core deduplicated is counted twice.
//
// # Bounds
//
// History is a ring of Samples samples (default 360: an hour at one per 10 s interval),
// each with every region and the Top (default 20) most demanded identities. An identity
// enters only by being among the Core's Top by demand, so keys a client invents cost
// nothing unless they out-demand the real ones, and even then at most Samples × Top
// identities are referred to. Memory, for R regions:
//
//	per sample   ≈ 130 B + R × 130 B + Top × (90 B + 32 B × R + key bytes)
//	counters     Top × R × 16 B (the identities being counted until the next sample)
//
// With the defaults and R = 3 that is ≈ 4.2 KB a sample, 1.5 MB for the hour, plus the
// identities' names: shared with the Core's while it tracks them, and at most 2 ×
// balancer.MaxNameLen = 1 KB each, so ≤ 7.4 MB more in the worst case (every sample a
// different top of maximal names). Samples ≤ MaxSamples and Top ≤ MaxTop bound it
// whatever the configuration. A sample costs one Core.Stats and one Core.Top
// (O(tracked × log Top) under the Core's mutex, once an interval); a page costs one
// Core.Stats, a few Core.Identity lookups and O(Samples × Top) of rendering.
package dashboard
