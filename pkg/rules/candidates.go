package rules

import "time"

// Candidate is one rule whose match fits a request, for explaining which rule applies
// and why: the winner of its By-dimension and mode (Won, the rule Match returns), or one
// it beat (less specific, or written later), or one that would fit but has expired.
type Candidate struct {
	Rule        *Compiled
	Specificity int
	Won         bool
	Expired     bool
}

// Candidates returns every rule whose match fits a at now or would but for its expiry, in
// set order, marking the ones Match picks. For tools ("why was I limited?"): it scans the
// whole set and allocates; never call it on the check path.
func (s *Snapshot) Candidates(a *Attrs, now time.Time) []Candidate {
	won := map[*Compiled]bool{}
	for _, m := range s.Match(a, now, nil) {
		won[m.Rule] = true
	}
	ip := a.IP.Unmap().WithZone("")
	var out []Candidate
	for i := range s.rules {
		r := &s.rules[i]
		if !known(r.c.By, a, ip) {
			continue
		}
		fits := r.matches(a, ip, time.Time{}) && (r.desc == nil || r.fitsDescriptor(a)) // the zero time: before every expiry
		if !fits {
			continue
		}
		out = append(out, Candidate{Rule: &r.c, Specificity: r.score, Won: won[&r.c], Expired: !r.matches(a, ip, now)})
	}
	return out
}
