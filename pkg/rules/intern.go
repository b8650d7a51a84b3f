package rules

import (
	"hash/maphash"
	"net/netip"
	"sync/atomic"
)

// internSlots is the size of a snapshot's identity cache: two ways of 2^15 slots, 512 KiB
// of pointers, allocated by the first Match. With 10,000 identities in play about one in
// twenty finds both of its ways taken by others and builds its string again.
const internSlots = 1 << 16

// identities caches the identity strings Match builds ("key:<api key>", "org:<org>",
// "ep:<endpoint>", "ip:<addr>", "ip6:<prefix>"), so that the checks of one identity share
// one string: no allocation per check, and the tables keyed by identity after the match
// (leases, buckets, usage) compare it by its pointer instead of reading its bytes, a cache
// miss each on a busy enforcer. Bounded whatever the clients send: a fixed array of slots,
// two candidate slots an identity, a miss replaces one of them. Safe for concurrent use:
// a slot is an atomic pointer to an immutable entry.
type identities struct {
	seed  maphash.Seed
	slots [internSlots]atomic.Pointer[interned]
}

// interned is one cached identity: id, built from the attribute raw (id[len(prefix):],
// the same allocation) under by, or from ip for the address dimensions.
type interned struct {
	by  By
	raw string
	ip  netip.Addr
	id  string
}

// internTable returns s's identity cache, allocating it on the first call.
func (s *Snapshot) internTable() *identities {
	if t := s.interns.Load(); t != nil {
		return t
	}
	t := &identities{seed: maphash.MakeSeed()}
	if s.interns.CompareAndSwap(nil, t) {
		return t
	}
	return s.interns.Load()
}

// ways returns the two slots h may live in.
func (t *identities) ways(h uint64) (*atomic.Pointer[interned], *atomic.Pointer[interned]) {
	i := h % (internSlots / 2) * 2
	return &t.slots[i], &t.slots[i+1]
}

// store stores e in one of its ways: an empty one, else the one h's top bit picks.
func store(a, b *atomic.Pointer[interned], h uint64, e *interned) {
	switch {
	case a.Load() == nil:
		a.Store(e)
	case b.Load() == nil || h>>63 == 1:
		b.Store(e)
	default:
		a.Store(e)
	}
}

// text returns prefix+raw, from the cache when it holds it.
func (t *identities) text(by By, prefix, raw string) string {
	h := maphash.String(t.seed, raw) ^ uint64(by)
	a, b := t.ways(h)
	if e := a.Load(); e != nil && e.by == by && e.raw == raw {
		return e.id
	}
	if e := b.Load(); e != nil && e.by == by && e.raw == raw {
		return e.id
	}
	id := prefix + raw
	store(a, b, h, &interned{by: by, raw: id[len(prefix):], id: id})
	return id
}

// addr returns the identity of the client address ip (already unmapped and masked to its
// prefix), from the cache when it holds it; format builds it on a miss.
func (t *identities) addr(ip netip.Addr, format func(netip.Addr) string) string {
	b16 := ip.As16()
	h := maphash.Bytes(t.seed, b16[:]) ^ uint64(ByIP)
	if ip.Is4() {
		h ^= 4 << 8
	}
	a, b := t.ways(h)
	if e := a.Load(); e != nil && e.by == ByIP && e.ip == ip {
		return e.id
	}
	if e := b.Load(); e != nil && e.by == ByIP && e.ip == ip {
		return e.id
	}
	id := format(ip)
	store(a, b, h, &interned{by: ByIP, ip: ip, id: id})
	return id
}
