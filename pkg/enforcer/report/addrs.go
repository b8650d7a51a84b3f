package report

import (
	"fmt"
	"net"
	"strconv"
)

// CheckAddr reports whether addr is a usable "host:port": a non-empty host and a port in
// [1, 65535]. The error says what is wrong, without naming a field (callers do).
func CheckAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %w", addr, err)
	}
	if host == "" {
		return fmt.Errorf("%q has an empty host", addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("%q: port %q, want a number in [1, 65535]", addr, port)
	}
	return nil
}

// AddrRing is a fixed list of balancer report addresses as a region reaches them (the
// enforcers' ReporterConfig.Addrs, an aggregator's upstream addresses): instead of a
// LeaderSource, each attempt goes round the list once. Kept apart from the sending so its
// rules are tested without a network. Not safe for concurrent use: one sender owns it.
type AddrRing struct {
	addrs []string
	cur   int // the address that last accepted (the first of the list before any)
}

// NewAddrRing returns the rotation of addrs (copied; at least one).
func NewAddrRing(addrs []string) *AddrRing {
	return &AddrRing{addrs: append([]string(nil), addrs...)}
}

// Pass is one attempt over the ring: each address at most once, from the one that last
// accepted.
type Pass struct {
	ring  *AddrRing
	tried []bool
	at    int // index being tried; -1 when the pass is over
}

// Pass starts an attempt.
func (a *AddrRing) Pass() *Pass {
	return &Pass{ring: a, tried: make([]bool, len(a.addrs)), at: a.cur}
}

// Addr is the address to try now; ok is false when every address has been tried.
func (p *Pass) Addr() (addr string, ok bool) {
	if p.at < 0 {
		return "", false
	}
	p.tried[p.at] = true
	return p.ring.addrs[p.at], true
}

// Accepted keeps the address tried now for the next attempts.
func (p *Pass) Accepted() { p.ring.cur = p.at }

// Failed moves on after an error or a non-leader answer from the address tried now:
// to redirect if a standby named an address of the list not tried in this pass, else to
// the next untried address in list order. It says whether the redirect was followed
// (false for "" and for an address not in the list, which is never dialled).
func (p *Pass) Failed(redirect string) (followed bool) {
	n := len(p.ring.addrs)
	if redirect != "" {
		for i, a := range p.ring.addrs {
			if a == redirect && !p.tried[i] {
				p.at = i
				return true
			}
		}
	}
	for d := 1; d < n; d++ {
		if i := (p.at + d) % n; !p.tried[i] {
			p.at = i
			return false
		}
	}
	p.at = -1
	return false
}
