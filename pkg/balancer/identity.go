package balancer

// LeaderIdentity returns the current term's state of (rule, identity) when this replica
// leads (leading true); tracked is false when the core does not track it (it has the
// default split). A standby answers leading false: read the published set in etcd instead
// (pkg/contract). For the admin API and tools; it takes the core's lock briefly.
func (s *Service) LeaderIdentity(rule, identity string) (st IdentityState, tracked, leading bool) {
	core := s.currentCore()
	if core == nil {
		return IdentityState{}, false, false
	}
	st, tracked = core.Identity(rule, identity)
	return st, tracked, true
}

// Regions returns the regions shares are split between, in the core's order.
func (s *Service) Regions() []string { return append([]string(nil), s.cfg.Core.Regions...) }
