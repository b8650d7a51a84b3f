package enforcer

import (
	"hash/maphash"
	"sync"
	"time"
)

// recentShards splits the ring so concurrent checks of different identities rarely share
// a lock; all decisions of one identity land in one shard, so explain reads one.
const recentShards = 16

// recentRing keeps the newest takes' outcomes, by identity: Config.RecentDecisions
// entries split over recentShards rings of equal size, each overwritten oldest first. A
// hot identity can fill its shard; explain then shows only its own newest. Recording
// takes one shard lock and copies three words and two strings the check already holds
// (the identity from the rules match, the rule id from the snapshot): no allocation.
type recentRing struct {
	seed   maphash.Seed
	per    int
	shards [recentShards]recentShard
}

type recentShard struct {
	mu    sync.Mutex // mu guards next, full and items
	next  int
	full  bool
	items []recentItem
	_     [40]byte // keep shards on separate cache lines
}

type recentItem struct {
	at       int64 // Unix ns
	identity string
	rule     string
	source   Source
	allowed  bool
}

// RecentDecision is one take of an identity as the ring recorded it.
type RecentDecision struct {
	At      time.Time `json:"at"`
	Rule    string    `json:"rule"`
	Allowed bool      `json:"allowed"`
	Source  string    `json:"source"`
}

func newRecentRing(n int) *recentRing {
	if n <= 0 {
		return nil
	}
	r := &recentRing{seed: maphash.MakeSeed(), per: max(1, (n+recentShards-1)/recentShards)}
	for i := range r.shards {
		r.shards[i].items = make([]recentItem, r.per)
	}
	return r
}

func (r *recentRing) add(identity, rule string, allowed bool, src Source, now time.Time) {
	if r == nil {
		return
	}
	s := &r.shards[maphash.String(r.seed, identity)%recentShards]
	s.mu.Lock()
	s.items[s.next] = recentItem{at: now.UnixNano(), identity: identity, rule: rule, source: src, allowed: allowed}
	s.next++
	if s.next == len(s.items) {
		s.next, s.full = 0, true
	}
	s.mu.Unlock()
}

// of returns identity's recorded takes, newest first.
func (r *recentRing) of(identity string) []RecentDecision {
	if r == nil {
		return nil
	}
	s := &r.shards[maphash.String(r.seed, identity)%recentShards]
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []RecentDecision
	n := s.next
	if s.full {
		n = len(s.items)
	}
	for i := 0; i < n; i++ {
		it := &s.items[(s.next-1-i+len(s.items))%len(s.items)]
		if it.identity == identity {
			out = append(out, RecentDecision{At: time.Unix(0, it.at).UTC(), Rule: it.rule, Allowed: it.allowed, Source: it.source.String()})
		}
	}
	return out
}
