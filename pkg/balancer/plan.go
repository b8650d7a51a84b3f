package balancer

import (
	"slices"
	"time"

	"github.com/allot-dev/allot/pkg/share"
)

// The change plan (see the package doc): how an identity's published shares move to its
// target so that the shares its regions may be enforcing sum to ≤ 1 at every instant, also
// while some enforcers apply one version and some another. acks reads from the reports the
// version each region is known to apply; a plan holds that for one Tick and, per identity,
// says what each region may be enforcing (mayApply) and steps the published shares toward
// the target (step: decreases at once, increases only as far as the sum allows,
// share.Step). advance steps the pending identities and keeps the Core's books; trimLog
// forgets the versions every region has moved past.

// verEntry is one version in the Core's log: kept until every region has moved past it.
type verEntry struct {
	v      uint64
	landed time.Time // zero until Published
}

// histEntry is an identity's shares as an earlier version published them, kept (ident.hist)
// while some region may still apply that version.
type histEntry struct {
	v      uint64 // the version these shares were published at
	shares []float64
}

// acks returns, per region, the newest version the region is known to have moved to: the
// least version applied by its enforcers that may still be enforcing what they last
// acknowledged. Only reports acknowledge: a write that landed in etcd says nothing about
// an enforcer cut off from etcd, which would go on enforcing its old, larger share while
// the others were given more (counting a decrease as applied AckTimeout after it landed
// lets the region-down drill reach Σ 1.22).
//
// The reservation is per enforcer: an enforcer that fell silent keeps holding its region's
// acknowledgement at the version it last reported until it has fenced itself by its own
// staleness rule — Stale without an accepted report, plus AckTimeout for the round trip
// it counts from (pkg/enforcer/overrides) — and only its region's other enforcers' reports do not
// release it (otherwise one enforcer cut off from the control plane while its region-mates
// report goes on enforcing its old share: 1.09-1.15 of the limit in enforcer-isolated.yaml).
// After that it
// enforces at most min(its share, default split): while such a fenced enforcer is
// remembered, or its region's reports count an enforcer marked fenced in their store
// (heardRegion), fenced[r] reserves the default share for its region (see mayApply). A region
// all of whose enforcers fenced (or that was never heard, for Stale + AckTimeout since
// this term began) is gone: it acknowledges every version and clampGone reserves the
// default split for it instead.
func (c *Core) acks(now time.Time) []uint64 {
	out := make([]uint64, c.n)
	fence := c.cfg.Stale + c.cfg.AckTimeout
	for r := range c.regions {
		rs := &c.regions[r]
		var byReport uint64
		any := false
		for name, e := range rs.enforcers {
			if !e.markedAt.IsZero() && e.markLast.Sub(e.markedAt) >= c.cfg.AckTimeout && now.Sub(e.lastHeard) < fence {
				// It fenced itself as cut off alone, and region-mates' reports have shown its
				// mark for AckTimeout (fenceMarks): it enforces at most min(its share,
				// default) of the versions from the one it applied, which its region keeps
				// while its mark is listed (released, mayApply); the record goes.
				if rs.released == nil {
					rs.released = map[string]*releasedEnf{}
				}
				rs.released[name] = &releasedEnf{ver: c.mapApplied(e), seen: e.markLast, seq: max(e.markSeq, e.maxSeq)}
				delete(rs.enforcers, name)
				c.membersGen++
				continue
			}
			if now.Sub(e.lastHeard) >= fence {
				// It has fenced itself by its staleness rule: it enforces at most its default
				// split. Its region keeps that reserved for another Stale (fencedUntil, and
				// while reports count its mark) and the record goes, so the table holds only
				// enforcers that may still enforce more.
				rs.fencedUntil = later(rs.fencedUntil, e.lastHeard.Add(2*c.cfg.Stale+c.cfg.AckTimeout))
				delete(rs.enforcers, name)
				c.membersGen++
				continue
			}
			v := c.mapApplied(e)
			if !any || v < byReport {
				byReport = v
			}
			any = true
		}
		last := rs.lastHeard
		if last.IsZero() || last.Before(c.start) {
			last = c.start
		}
		c.gone[r] = !any && now.Sub(last) >= fence
		c.fenced[r] = any && now.Before(rs.fencedUntil)
		c.relAny[r], c.relAck[r] = false, 0
		for name, x := range rs.released {
			if now.Sub(x.seen) >= c.fenceHold() {
				delete(rs.released, name) // no longer marked: crashed, or heard again elsewhere
				continue
			}
			if !c.relAny[r] || x.ver < c.relAck[r] {
				c.relAck[r] = x.ver
			}
			c.relAny[r] = true
		}
		out[r] = byReport
		if c.gone[r] {
			out[r] = c.version
		}
	}
	return out
}

// mapApplied is the version of ours an enforcer's applied set stands for: a set of this
// term is itself; the restored set (or an older one of that leader) is at most the
// restored version; anything else counts for nothing.
func (c *Core) mapApplied(e *enforcerState) uint64 {
	switch {
	case e.appliedRev == c.cfg.LeaderRev:
		return e.appliedVer
	case c.restoredRev != 0 && e.appliedRev == c.restoredRev:
		return min(e.appliedVer, c.restoredVer)
	}
	return 0
}

// plan is the change plan as one Tick applies it: per region, the newest version it is
// known to apply and what beyond the versions since it may be enforcing, and the version a
// change takes. Core.planFor builds it from acks.
type plan struct {
	n int
	// ack[r]: every enforcer of region r that may still enforce more than its default share
	// reports applying a version ≥ ack[r] (acks).
	ack []uint64
	// gone[r]: region r enforces at most the default split; fenced[r]: through an enforcer
	// that fenced itself it may enforce up to it (acks, clampGone).
	gone, fenced []bool
	// relAny[r]: region r has enforcers released on their marks as cut off alone, which
	// may enforce min(share, default) of any version from relAck[r] on (acks, mayApply).
	relAny []bool
	relAck []uint64
	rel    []float64 // scratch, n long
	// restored: this term began from an old leader's set at version restoredVer, whose
	// earlier versions it does not know (mayApply).
	restored    bool
	restoredVer uint64
	next        uint64    // the version a change takes
	may         []float64 // scratch, n long
}

// planFor is this Tick's plan, ack being what acks returned. Called with c.mu held.
func (c *Core) planFor(ack []uint64) plan {
	return plan{n: c.n, ack: ack, gone: c.gone, fenced: c.fenced, relAny: c.relAny, relAck: c.relAck, rel: c.relBuf,
		restored: c.restoredRev != 0, restoredVer: c.restoredVer, next: c.version + 1, may: c.mayBuf}
}

// mayApply fills dst with, per region, the largest share of id among the versions the
// region may still apply (see the package doc) and prunes the versions no region applies.
//
// A region that has not acknowledged the version this core restored (a new leader's
// starting point) may be applying any earlier version of the old leader, whose shares this
// core does not know: it is taken to apply up to 1 (package share: a new leader that does
// not know what is applied assumes the most), so nothing increases against it until it
// reports the restored version or one of ours, or is gone.
func (p *plan) mayApply(id *ident, dst []float64) {
	copy(dst, id.published(p.n))
	defer p.clampGone(id, dst)
	if p.restored {
		for r := range dst {
			if p.ack[r] < p.restoredVer {
				dst[r] = 1
			}
		}
	}
	released := false // some region has enforcers released on their marks (acks)
	for _, any := range p.relAny {
		released = released || any
	}
	if released && len(id.def) != len(dst) {
		released = false // no default split to cap them at (never, for a tracked identity)
	}
	if released && p.restored {
		for r, any := range p.relAny {
			if any && p.relAck[r] < p.restoredVer {
				dst[r] = max(dst[r], id.def[r]) // an old leader's version: up to its default
			}
		}
	}
	if len(id.hist) == 0 {
		return // what released enforcers may apply is at most the published shares
	}
	low := slices.Min(p.ack)
	rel := p.rel
	if released {
		copy(rel, id.published(p.n))
		for r, any := range p.relAny {
			if any {
				low = min(low, p.relAck[r])
			}
		}
	}
	keep := 0
	for i, h := range id.hist {
		next := id.pubVer // the version that replaced h
		if i+1 < len(id.hist) {
			next = id.hist[i+1].v
		}
		if next <= low {
			continue // every region moved past h
		}
		id.hist[keep] = h
		keep++
		for r := range dst {
			if next > p.ack[r] {
				dst[r] = max(dst[r], h.shares[r])
			}
			if released && p.relAny[r] && next > p.relAck[r] {
				rel[r] = max(rel[r], h.shares[r])
			}
		}
	}
	if released {
		// A released enforcer enforces at most min(share, default) of any version from the
		// one it had applied.
		for r, any := range p.relAny {
			if any {
				dst[r] = max(dst[r], min(rel[r], id.def[r]))
			}
		}
	}
	clear(id.hist[keep:])
	id.hist = id.hist[:keep]
	if keep == 0 {
		id.hist = nil
	}
}

// clampGone sets what a gone region (see acks) may be applying to the identity's default
// share: a stale enforcer enforces min(last, default), whichever last it holds, so at
// most the default (errs under by what its last share was below it).
//
// A region some of whose enforcers report while another has fenced itself (fenced) may
// be enforcing, through that one, up to its default share: dst[r] is raised to it.
func (p *plan) clampGone(id *ident, dst []float64) {
	if len(id.def) != len(dst) {
		return
	}
	for r, g := range p.gone {
		switch {
		case g:
			dst[r] = id.def[r]
		case p.fenced[r]:
			dst[r] = max(dst[r], id.def[r])
		}
	}
}

// step moves id's published shares toward its target by one version: share.Step against
// what the regions may apply, so decreases go out at once and increases only as far as
// Σ_r max(mayApply_r, next_r) ≤ 1 allows. The shares it replaces stay in id.hist while some
// region may apply them. It reports whether the published shares changed (they then take
// version p.next).
func (p *plan) step(id *ident) bool {
	may := p.may
	p.mayApply(id, may) // also prunes id.hist of the versions every region moved past
	pub, tgt := id.published(p.n), id.target(p.n)
	if equal(pub, tgt) {
		return false
	}
	nx, _ := share.Step(may, tgt)
	// Step raises no region above what it may apply when Σ may > 1, but that bound is
	// loose for a region that may apply "anything" (1: a restored set it has not
	// acknowledged): to Step a share under 1 is no increase for it, yet it is one over
	// what it really enforces. With the sum over 1 no increase is safe: none goes past
	// the published share (a new leader whose regions had not all acknowledged its
	// restored set once raised one of them to 0.94 beside an isolated enforcer's 0.98).
	if share.StepSum(may, nx) > 1+1e-9 {
		for r := range nx {
			nx[r] = min(nx[r], pub[r])
		}
	}
	if equal(nx, pub) {
		return false
	}
	id.hist = append(id.hist, histEntry{v: id.pubVer, shares: slices.Clone(pub)})
	copy(pub, nx)
	id.pubVer = p.next
	p.mayApply(id, may)
	return true
}

// advance steps the change plan of every pending identity (of every identity after a
// recompute) and reports whether a published share changed; the change takes the next
// version.
func (c *Core) advance(p *plan, all bool) bool {
	changed := false
	held := false
	listed := 0
	step := func(id *ident) {
		pub, tgt := id.published(c.n), id.target(c.n)
		wasDefault := equal(pub, id.def)
		if p.step(id) {
			changed = true
		}
		settled := equal(pub, tgt) && len(id.hist) == 0
		if !equal(pub, tgt) {
			held = true
		}
		atDefault := equal(pub, id.def)
		if id.evict && settled && atDefault {
			c.forget(id)
			return
		}
		if !atDefault {
			listed++
		}
		if wasDefault != atDefault && !all {
			if atDefault {
				c.listed--
			} else {
				c.listed++
			}
		}
		if settled != !id.pending {
			if settled {
				delete(c.pending, id)
			} else {
				c.pending[id] = struct{}{}
			}
			id.pending = !settled
		}
	}
	if all {
		for i := 0; i < len(c.all); i++ {
			id := c.all[i]
			step(id)
			if i < len(c.all) && c.all[i] != id { // forgotten: another took its place
				i--
			}
		}
		c.listed = listed
	} else {
		for id := range c.pending {
			step(id)
		}
	}
	if changed {
		c.held = held
	}
	return changed
}

// trimLog drops versions every region has moved past, keeping the newest such one.
func (c *Core) trimLog(ack []uint64) {
	low := slices.Min(ack)
	i := 0
	for i+1 < len(c.log) && c.log[i+1].v <= low && !c.log[i+1].landed.IsZero() {
		i++
	}
	if i > 0 {
		c.log = slices.Delete(c.log, 0, i)
	}
	if len(c.log) > 1024 { // bounded whatever happens to acknowledgements
		c.log = slices.Delete(c.log, 0, len(c.log)-1024)
	}
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
