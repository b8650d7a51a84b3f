package report

import (
	"cmp"
	"slices"
	"time"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// drained is one tracked pair of a finished interval, with what Report decides about it.
// e points into the drained table's slab (which Report resets once it is done with it)
// or into Table.quiet: the report sorts these three words, not a copy of each entry.
type drained struct {
	e         *entry
	rate      float64
	pressured bool
}

func (d *drained) volume() int64 { return d.e.admitted + d.e.refused }

// Report ends the current interval at now and returns its report; the next interval
// starts at now. It fills interval_start_ms/interval_end_ms ([start, now) in Unix ms),
// usage and the omitted counts; the caller fills region, enforcer_id, seq, the share
// version and early. It never returns nil: an interval with no traffic gives a report
// with no usage, which still tells the balancer this enforcer is alive.
//
// Which pairs: every pair under pressure — refused anything, or admitted more than
// PressureFraction × RegionalRate × (now − start) — then the busiest of the rest by
// volume (admitted + refused), MaxIdentities in all; pressured pairs first, each group by
// volume, largest first (ties by rule, then identity). omitted_identities counts the
// tracked pairs left out plus the pairs evicted during the interval (an identity evicted
// and seen again counts again, so it is an upper bound on distinct identities);
// omitted_tokens is exact: every token observed that no reported count includes.
//
// Each entry also carries its recent rate: its tokens over about the last second
// (Table's slots of RecentSlot), which the balancer reads as the region's demand when a
// key's traffic moves.
//
// The work (a copy and a sort of at most Capacity pairs, one RegionalRate call each) is
// done outside the stripe locks: a stripe is locked only to swap in its empty spare.
func (t *Table) Report(now time.Time) *allotv1.ReportRequest {
	t.mu.Lock()
	defer t.mu.Unlock()
	start := t.start
	length := max(now.Sub(start), 0)
	// Cleared before the stripes are swapped: a jump counted in the old interval after
	// this point can only cause one spare early report, never hide a jump in the new one.
	t.jumped.Store(false)
	t.start = now
	t.startN.Store(now.UnixNano())

	// Last interval's refusals, scaled to a whole Interval, are what a jump is measured
	// against; a very short interval is taken as EarlyGap long, so the scale stays <=
	// Interval/EarlyGap.
	scale := float64(t.cfg.Interval) / float64(max(length, t.cfg.EarlyGap))
	items, qs := t.items[:0], t.quiet[:0]
	var total, evicted int64
	cur := now.UnixNano() / int64(RecentSlot)
	for i := range t.stripes {
		s := &t.stripes[i]
		s.mu.Lock()
		old := s.cur
		s.cur = s.spare
		last := s.prev // the previous report's pairs (read-only once published)
		s.mu.Unlock()

		// Quiet pairs: had tokens in the second before the last report, none since. Their
		// entry (no counts, the recent rate of what is left of that second) tells the
		// balancer the traffic left this region now, not an interval later: a key that
		// moved elsewhere is released in the first round trip (issue 21 §2).
		for k, st := range last {
			if st.first == 0 || st.rule == nil {
				continue
			}
			if _, ok := old.m[k]; ok {
				continue
			}
			qs = append(qs, entry{key: k, rule: st.rule, first: st.first, slots: st.slots})
		}

		total += old.total
		evicted += old.evicted
		var prev map[pair]prevState
		hint := len(last) // about as many as the last report's: no rehashing as it grows
		for _, e := range old.heap {
			items = append(items, drained{e: e})
			var st prevState
			if e.refused > 0 {
				st.refused = int64(float64(e.refused) * scale)
			}
			for _, sl := range e.slots {
				if sl.id > cur-recentSlots && sl.tokens > 0 { // tokens in the last second
					st.first, st.slots, st.rule = e.first, e.slots, e.rule
					break
				}
			}
			if st.refused > 0 || st.first != 0 {
				if prev == nil {
					prev = make(map[pair]prevState, hint)
				}
				prev[e.key] = st
			}
		}
		s.mu.Lock()
		s.prev = prev
		s.mu.Unlock()
		s.spare = old // reset below, once the report is built from its entries
	}
	quiet := make([]drained, len(qs))
	for i := range qs {
		quiet[i].e = &qs[i]
	}
	defer func() {
		for i := range t.stripes {
			t.stripes[i].spare.reset()
		}
		clear(items) // drop the references to the drained entries
		clear(qs)
		t.items, t.quiet = items[:0], qs[:0]
	}()

	secs := length.Seconds()
	for i := range items {
		d := &items[i]
		d.rate = t.rate(d.e.rule, d.e.key.identity, now)
		d.pressured = d.e.refused > 0 || float64(d.e.admitted) > t.cfg.PressureFraction*d.rate*secs
	}
	slices.SortFunc(items, func(a, b drained) int { // a total order: pairs are unique
		switch {
		case a.pressured != b.pressured:
			if a.pressured {
				return -1
			}
			return 1
		case a.volume() != b.volume():
			return cmp.Compare(b.volume(), a.volume())
		case a.e.key.rule != b.e.key.rule:
			return cmp.Compare(a.e.key.rule, b.e.key.rule)
		}
		return cmp.Compare(a.e.key.identity, b.e.key.identity)
	})
	n := min(len(items), t.cfg.MaxIdentities)
	// Quiet entries fill what room is left, in a fixed order (regionsim replays byte for
	// byte); a pair left out is heard of at the next interval's average instead.
	nq := min(len(quiet), t.cfg.MaxIdentities-n)
	if nq < len(quiet) {
		slices.SortFunc(quiet, func(a, b drained) int {
			return cmp.Or(cmp.Compare(a.e.key.rule, b.e.key.rule), cmp.Compare(a.e.key.identity, b.e.key.identity))
		})
	}
	req := &allotv1.ReportRequest{
		IntervalStartMs: start.UnixMilli(),
		IntervalEndMs:   now.UnixMilli(),
		Usage:           make([]*allotv1.IdentityUsage, n+nq),
		RecentWindowMs:  uint32(recentSlots * RecentSlot / time.Millisecond),
	}
	// The entries in one allocation, not one each: a report is built on every
	// acknowledgement too, and its thousands of small objects were half of what the
	// 10,000-key population allocated (issue 26 §4). They live as long as the report.
	slab := make([]allotv1.IdentityUsage, n+nq)
	var reported int64
	for i, d := range items[:n] {
		reported += d.volume()
		u := &slab[i]
		u.Rule, u.Identity = d.e.key.rule, d.e.key.identity
		u.Admitted, u.Refused = float64(d.e.admitted), float64(d.e.refused)
		u.RegionalRate, u.Error = d.rate, float64(d.e.err)
		u.RecentRate, u.RecentTokens = d.e.recent(now.UnixNano())
		u.Draining = d.e.lowAt != 0 && now.UnixNano()-d.e.lowAt < int64(recentSlots*RecentSlot)
		req.Usage[i] = u
	}
	for i, d := range quiet[:nq] {
		u := &slab[n+i]
		u.Rule, u.Identity = d.e.key.rule, d.e.key.identity
		u.RegionalRate = t.rate(d.e.rule, d.e.key.identity, now)
		u.RecentRate, u.RecentTokens = d.e.recent(now.UnixNano())
		req.Usage[n+i] = u
	}
	req.OmittedIdentities = uint64(len(items)-n) + uint64(evicted)
	req.OmittedTokens = float64(total - reported)
	return req
}

// WantEarly reports whether an early report is due at now: some identity's refusals
// jumped this interval (refused > max(EarlyMinRefused, EarlyFactor × its refusals last
// interval scaled to one Interval); see the package doc) and at least EarlyGap has passed
// since the interval started (the last Report). Cheap: two atomic loads.
func (t *Table) WantEarly(now time.Time) bool {
	return t.jumped.Load() && now.Sub(time.Unix(0, t.startN.Load())) >= t.cfg.EarlyGap
}
