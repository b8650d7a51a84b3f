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

// addrRing is ReporterConfig.Addrs' rotation, kept apart from the sending so its rules
// are tested without a network. cur is the address that last accepted a report (the first
// of the list before any): every attempt starts there.
type addrRing struct {
	addrs []string
	cur   int
}

// pass is one attempt over the ring: each address at most once, from cur.
type pass struct {
	ring  *addrRing
	tried []bool
	at    int // index being tried; -1 when the pass is over
}

func (a *addrRing) pass() *pass {
	return &pass{ring: a, tried: make([]bool, len(a.addrs)), at: a.cur}
}

// addr is the address to try now; ok is false when every address has been tried.
func (p *pass) addr() (addr string, ok bool) {
	if p.at < 0 {
		return "", false
	}
	p.tried[p.at] = true
	return p.ring.addrs[p.at], true
}

// accepted keeps the address tried now for the next attempts.
func (p *pass) accepted() { p.ring.cur = p.at }

// failed moves on after an error or a non-leader answer from the address tried now:
// to redirect if a standby named an address of the list not tried in this pass, else to
// the next untried address in list order. It says whether the redirect was followed
// (false for "" and for an address not in the list, which is never dialled).
func (p *pass) failed(redirect string) (followed bool) {
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
