package balancer

import (
	"slices"

	"github.com/allot-dev/allot/pkg/contract"
)

// The enforcers a term counts for acknowledgements outlive it. acks holds a region's
// increases back while any enforcer of it that may still enforce more than its default
// split has not acknowledged the decrease — one cut off from the control plane until it
// has fenced itself (Stale + AckTimeout). That table was the leader's memory only: a new
// leader learnt enforcers from their reports, so one isolated before the change was
// invisible to it, its region's other enforcers acknowledged the restored version, and the
// other regions were given what the isolated one still enforced (a 2,000-key population
// with one enforcer isolated across leader changes: Σ shares 1.45, 1.10 of a key's limit
// over 60 s; configs/scenarios/isolated-across-leaders.yaml). So each term writes the
// table's names (contract.Members) before the first version after they changed, and a new
// leader restores them (RestoreMembers) as enforcers that apply nothing of its own: their
// region is held (mayApply: up to 1 against a restored set) until they report or have
// fenced themselves, counted from the new term's start, which is no earlier than their
// last accepted report. Which way it errs: under — a region with an enforcer that died
// without its final report is held for up to Stale + AckTimeout after a leader change,
// as the old leader would have held it from that enforcer's last report.

// unknownMember is the id RestoreMembers gives, in every region, the enforcers of a
// membership that could not be read: one placeholder held as an isolated enforcer would
// be. It is persisted as such, so the next term holds it too until it fences.
const unknownMember = ""

// members returns the regions' enforcer tables, or nil when they have not changed since
// the last Published ones. Called with c.mu held.
func (c *Core) members() *contract.Members {
	if c.membersGen == c.membersSent {
		return nil
	}
	m := &contract.Members{LeaderRev: c.cfg.LeaderRev, Regions: make(map[string][]string, c.n)}
	for r := range c.regions {
		rs := &c.regions[r]
		ids := make([]string, 0, len(rs.enforcers))
		for id := range rs.enforcers {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		m.Regions[rs.name] = ids
	}
	return m
}

// RestoreMembers seeds a new leader's core with the enforcers the last term counted
// (contract.Members, read with the set; see the comment above). known is false when
// they could not be read (absent beside a persisted set, or invalid): every region then
// holds one placeholder enforcer, so no region is given more against the restored set for
// Stale + AckTimeout after the term starts — the most a new leader that does not know
// may assume. Regions m names that are not ours are ignored. Call it before the first Ingest or Tick (ErrRestoreLate).
func (c *Core) RestoreMembers(m contract.Members, known bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started {
		return ErrRestoreLate
	}
	add := func(rs *regionState, id string) {
		if rs.enforcers[id] == nil && len(rs.enforcers) < c.cfg.MaxEnforcers {
			rs.enforcers[id] = &enforcerState{restored: true}
			c.membersGen++
		}
	}
	for r := range c.regions {
		rs := &c.regions[r]
		if !known {
			add(rs, unknownMember)
			continue
		}
		for _, id := range m.Regions[rs.name] {
			add(rs, id)
		}
	}
	return nil
}
