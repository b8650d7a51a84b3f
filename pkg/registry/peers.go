package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Member is one enforcer registered in a region, as read from etcd.
type Member struct {
	ID      string    `json:"id"`
	Region  string    `json:"region"`
	Addr    string    `json:"addr"`
	Started time.Time `json:"started"`
	// HTTPAddr is the enforcer's HTTP API address ("" when it registered none).
	HTTPAddr string `json:"http_addr,omitempty"`
	// Lease is the etcd lease holding the registration (0 if none), for debugging.
	Lease int64 `json:"lease,omitempty"`
}

// record is the JSON value stored under <prefix><region>/<id>.
type record struct {
	ID      string    `json:"id"`
	Region  string    `json:"region"`
	Addr    string    `json:"addr"`
	Started time.Time `json:"started"`
	// HTTPAddr: see Config.HTTPAddr.
	HTTPAddr string `json:"http_addr,omitempty"`
}

// entry is a Member with the etcd revision that last wrote it.
type entry struct {
	m   Member
	rev int64
}

// peerSet is the registry loop's view of one region: every key under the region's
// prefix is one live registration. It is owned by the loop goroutine (not safe for
// concurrent use) and does no I/O, so it is tested on its own.
type peerSet struct {
	prefix string // "<Prefix><Region>/"
	region string
	m      map[string]entry
}

func newPeerSet(prefix, region string) *peerSet {
	return &peerSet{prefix: prefix, region: region, m: make(map[string]entry)}
}

// reset replaces the set with a full listing taken at one revision.
func (p *peerSet) reset(kvs []kv) []error {
	p.m = make(map[string]entry, len(kvs))
	var errs []error
	for _, e := range kvs {
		if err := p.put(e.key, e.value, e.lease, e.rev); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// kv is the part of an etcd key-value the set needs.
type kv struct {
	key   string
	value []byte
	lease int64
	rev   int64 // ModRevision
}

// put records key as a live member. A value that does not decode still counts (the key
// exists, so something holds it): counting it errs toward a larger N, i.e. under. The
// error says what was wrong with the value. A put older than what the set holds for the
// key is ignored.
func (p *peerSet) put(key string, value []byte, lease, rev int64) error {
	if old, ok := p.m[key]; ok && rev < old.rev {
		return nil
	}
	id := strings.TrimPrefix(key, p.prefix)
	m := Member{ID: id, Region: p.region, Lease: lease}
	var rec record
	err := json.Unmarshal(value, &rec)
	if err == nil {
		m.Addr, m.Started, m.HTTPAddr = rec.Addr, rec.Started, rec.HTTPAddr
		if rec.ID != id || rec.Region != p.region {
			err = fmt.Errorf("registry: key %q holds id %q region %q", key, rec.ID, rec.Region)
		}
	} else {
		err = fmt.Errorf("registry: key %q: value does not decode: %w", key, err)
	}
	p.m[key] = entry{m: m, rev: rev}
	return err
}

// del removes key unless the set holds a newer write of it.
func (p *peerSet) del(key string, rev int64) {
	if old, ok := p.m[key]; ok && rev >= old.rev {
		delete(p.m, key)
	}
}

// get returns the member under key.
func (p *peerSet) get(key string) (Member, bool) {
	e, ok := p.m[key]
	return e.m, ok
}

// count returns N, the live enforcers in the region, counting this one exactly once:
// self is this enforcer's key, and ours reports whether a lease is (or was last) this
// enforcer's. If self is missing, or held by a lease that is not ours (a duplicate, or
// this enforcer's previous run whose lease has not expired yet), this enforcer is added:
// the result is always >= 1 and errs toward a larger N.
func (p *peerSet) count(self string, ours func(lease int64) bool) int {
	n := len(p.m)
	if e, ok := p.m[self]; !ok || !ours(e.m.Lease) {
		n++
	}
	return n
}

// members returns the set sorted by ID.
func (p *peerSet) members() []Member {
	out := make([]Member, 0, len(p.m))
	for _, e := range p.m {
		out = append(out, e.m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Errors a Registry reports. Healthy and Start wrap them with details; test with
// errors.Is.
var (
	// ErrNotStarted: Start has not been called.
	ErrNotStarted = errors.New("registry: not started")
	// ErrClosed: Close has been called.
	ErrClosed = errors.New("registry: closed")
	// ErrNotRegistered: this enforcer holds no registration now (etcd unreachable, lease
	// expired, or still registering). Peers keeps the last known count.
	ErrNotRegistered = errors.New("registry: not registered")
	// ErrLeaseStale: registered, but the lease has not been renewed for over 2/3 of its
	// TTL; etcd is probably unreachable and the registration may expire.
	ErrLeaseStale = errors.New("registry: lease not renewed")
	// ErrPeersStale: the peer watch is down; Peers is the last known count.
	ErrPeersStale = errors.New("registry: peer list stale")
	// ErrDuplicateID: another live enforcer holds this region and ID.
	ErrDuplicateID = errors.New("registry: duplicate id")
)

// health is the state Healthy judges, published by the loop under Registry.mu.
type health struct {
	registered bool
	lease      int64
	ttl        time.Duration // granted TTL of lease
	lastRenew  time.Time     // when lease was granted or last renewed
	regErr     error         // last failure to register, while not registered
	listErr    error         // last failure to list or watch peers, while not watching
	dup        error         // a confirmed duplicate ID, while not registered
}

// check returns nil if the registration is sound at now, else an error naming the
// problem. A lease silent for more than 2/3 of its TTL has missed two renewals (the
// client renews every TTL/3), so it is reported before it can expire.
func (h health) check(now time.Time) error {
	switch {
	case h.dup != nil:
		return h.dup
	case !h.registered && h.regErr != nil:
		return fmt.Errorf("%w: %w", ErrNotRegistered, h.regErr)
	case !h.registered:
		return fmt.Errorf("%w: registering", ErrNotRegistered)
	}
	if silent := now.Sub(h.lastRenew); silent > h.ttl*2/3 {
		return fmt.Errorf("%w: lease %x last renewed %s ago, TTL %s (etcd unreachable?)",
			ErrLeaseStale, h.lease, silent.Round(time.Millisecond), h.ttl)
	}
	if h.listErr != nil {
		return fmt.Errorf("%w: %w", ErrPeersStale, h.listErr)
	}
	return nil
}

// conflict is what the loop knows about another lease holding this enforcer's key.
// A dead holder's lease expires within the remaining TTL it had when first seen; one
// that outlives that (plus expiryGrace for etcd's rounding and expiry checks) is being
// renewed by a live process.
type conflict struct {
	holder    int64
	member    Member
	firstSeen time.Time
	expiresBy time.Time // firstSeen + remaining TTL + expiryGrace; zero if it never expires
}

// confirmed reports whether the holder is a live duplicate at now.
func (c *conflict) confirmed(now time.Time) bool {
	return c.expiresBy.IsZero() || now.After(c.expiresBy)
}

func (c *conflict) err(key string, now time.Time) error {
	who := fmt.Sprintf("%s held by lease %x (addr %q, started %s)", key, c.holder, c.member.Addr,
		c.member.Started.Format(time.RFC3339))
	switch {
	case c.holder == 0:
		return fmt.Errorf("%w: %s without a lease; it will never expire, delete it by hand", ErrDuplicateID, who)
	case c.confirmed(now):
		return fmt.Errorf("%w: %s, renewed past its TTL: another live enforcer has this id", ErrDuplicateID, who)
	default:
		return fmt.Errorf("%w: %s; waiting up to %s for it to expire (it may be this enforcer's previous run)",
			ErrDuplicateID, who, c.expiresBy.Sub(now).Round(time.Second))
	}
}
