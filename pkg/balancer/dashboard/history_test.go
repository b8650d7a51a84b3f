package dashboard

// identities is the number of distinct identities the history refers to (the ring's
// and the per-identity counters'), for tests of its bound.
func (h *History) identities() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := map[idKey]bool{}
	for _, s := range h.ring {
		for _, x := range s.ids {
			seen[x.k] = true
		}
	}
	for k := range h.tracked {
		seen[k] = true
	}
	return len(seen)
}
