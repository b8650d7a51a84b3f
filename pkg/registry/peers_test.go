package registry

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

const testPrefix = "/allot/enforcers/us/"

func value(t *testing.T, id string) []byte {
	t.Helper()
	b, err := json.Marshal(record{ID: id, Region: "us", Addr: id + ":8081", Started: time.Unix(100, 0).UTC()})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPeerSetCount steps through the events the loop sees and checks N after each,
// including the cases where this enforcer (key ".../me") must count itself.
func TestPeerSetCount(t *testing.T) {
	p := newPeerSet(testPrefix, "us")
	const self = testPrefix + "me"
	var cur, prev int64 // this enforcer's current and previous lease
	ours := func(l int64) bool { return l != 0 && (l == cur || l == prev) }
	put := func(id string, lease, rev int64) {
		if err := p.put(testPrefix+id, value(t, id), lease, rev); err != nil {
			t.Fatalf("put %s: %v", id, err)
		}
	}
	steps := []struct {
		name string
		do   func()
		want int
	}{
		{"empty: counts itself", func() {}, 1},
		{"one other, not registered yet", func() { put("a", 7, 2) }, 2},
		{"registered", func() { cur = 9; put("me", 9, 3) }, 2},
		{"two others", func() { put("b", 8, 4) }, 3},
		{"lease lost on our side: last view kept, self still counted once", func() { prev, cur = 9, 0 }, 3},
		{"re-registered with a new lease", func() { cur, prev = 10, 0; put("me", 10, 6) }, 3},
		{"stale delete of own key is ignored", func() { p.del(self, 5) }, 3},
		{"stale put of a peer is ignored", func() { put("a", 6, 1) }, 3},
		{"peer leaves", func() { p.del(testPrefix+"a", 7) }, 2},
		{"own key taken by another lease: duplicate, count self on top", func() { put("me", 99, 8); cur, prev = 0, 10 }, 3},
		{"own key deleted", func() { p.del(self, 9) }, 2},
	}
	for _, s := range steps {
		s.do()
		if got := p.count(self, ours); got != s.want {
			t.Fatalf("%s: count = %d, want %d (members %+v)", s.name, got, s.want, p.members())
		}
	}
	if m, ok := p.get(testPrefix + "b"); !ok || m.Addr != "b:8081" || m.Lease != 8 || !m.Started.Equal(time.Unix(100, 0)) {
		t.Fatalf("member b = %+v, %v", m, ok)
	}
}

func TestPeerSetOddValuesStillCount(t *testing.T) {
	p := newPeerSet(testPrefix, "us")
	errs := p.reset([]kv{
		{key: testPrefix + "a", value: value(t, "a"), lease: 1, rev: 1},
		{key: testPrefix + "junk", value: []byte("{not json"), lease: 2, rev: 2},
		{key: testPrefix + "c", value: value(t, "other"), lease: 3, rev: 3},
	})
	if len(errs) != 2 || !strings.Contains(errs[0].Error(), "junk") || !strings.Contains(errs[1].Error(), `id "other"`) {
		t.Fatalf("reset errors = %v", errs)
	}
	if n := p.count(testPrefix+"me", func(int64) bool { return false }); n != 4 {
		t.Fatalf("count = %d, want 4 (3 keys + self)", n)
	}
	ms := p.members()
	if len(ms) != 3 || ms[0].ID != "a" || ms[1].ID != "c" || ms[2].ID != "junk" {
		t.Fatalf("members = %+v, want sorted a, c, junk", ms)
	}
}

func TestHealthCheck(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ok := health{registered: true, lease: 0xab, ttl: 3 * time.Second, lastRenew: t0}
	for _, tc := range []struct {
		name string
		h    health
		now  time.Time
		want error // nil, or the sentinel the error must wrap
		text string
	}{
		{"fresh", ok, t0.Add(time.Second), nil, ""},
		{"one renewal late is fine", ok, t0.Add(2 * time.Second), nil, ""},
		{"two renewals missed", ok, t0.Add(2001 * time.Millisecond), ErrLeaseStale, "lease ab last renewed 2.001s ago, TTL 3s"},
		{"registering", health{}, t0, ErrNotRegistered, "registering"},
		{"failing to register", health{regErr: errors.New("etcd down")}, t0, ErrNotRegistered, "etcd down"},
		{"duplicate", health{dup: ErrDuplicateID, regErr: errors.New("x")}, t0, ErrDuplicateID, ""},
		{"watch down", health{registered: true, ttl: 3 * time.Second, lastRenew: t0, listErr: errors.New("no leader")}, t0, ErrPeersStale, "no leader"},
	} {
		err := tc.h.check(tc.now)
		if tc.want == nil {
			if err != nil {
				t.Errorf("%s: check = %v, want nil", tc.name, err)
			}
			continue
		}
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: check = %v, want %v containing %q", tc.name, err, tc.want, tc.text)
		}
	}
}

func TestConflict(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := &conflict{holder: 0x1f, member: Member{Addr: "h:1"}, firstSeen: t0, expiresBy: t0.Add(4 * time.Second)}
	for _, tc := range []struct {
		at        time.Duration
		confirmed bool
		text      string
	}{
		{0, false, "waiting up to 4s"},
		{4 * time.Second, false, "waiting up to 0s"},
		{4*time.Second + 1, true, "another live enforcer"},
	} {
		now := t0.Add(tc.at)
		err := c.err("/k", now)
		if c.confirmed(now) != tc.confirmed || !errors.Is(err, ErrDuplicateID) ||
			!strings.Contains(err.Error(), tc.text) || !strings.Contains(err.Error(), `/k held by lease 1f (addr "h:1"`) {
			t.Errorf("at %v: confirmed %v, err %v; want confirmed %v, text %q", tc.at, c.confirmed(now), err, tc.confirmed, tc.text)
		}
	}
	noLease := &conflict{firstSeen: t0}
	if !noLease.confirmed(t0) || !strings.Contains(noLease.err("/k", t0).Error(), "without a lease") {
		t.Errorf("a key without a lease must be a confirmed duplicate: %v", noLease.err("/k", t0))
	}
}

// TestPeerSetHTTPAddr: the HTTP address an enforcer registers reaches its Member (the
// balancer's explain asks it there); a record without one (an older enforcer) has none.
func TestPeerSetHTTPAddr(t *testing.T) {
	p := newPeerSet(testPrefix, "us")
	b, _ := json.Marshal(record{ID: "a", Region: "us", Addr: "a:8081", HTTPAddr: "a:8080"})
	if err := p.put(testPrefix+"a", b, 1, 1); err != nil {
		t.Fatal(err)
	}
	if err := p.put(testPrefix+"b", value(t, "b"), 1, 2); err != nil {
		t.Fatal(err)
	}
	a, _ := p.get(testPrefix + "a")
	old, _ := p.get(testPrefix + "b")
	if a.HTTPAddr != "a:8080" || old.HTTPAddr != "" {
		t.Fatalf("http addrs %q %q", a.HTTPAddr, old.HTTPAddr)
	}
}
