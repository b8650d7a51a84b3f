package report

import (
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/rules"
)

// Table counts, per interval and per (rule id, identity), the tokens this enforcer
// admitted and refused, in bounded memory: each of Config.Stripes stripes is a weighted
// Space-Saving table of Capacity/Stripes pairs (see the package doc for the bounds and
// which way they err). It implements enforcer.UsageObserver (the enforcer node asserts it; this package does not import the enforcer).
//
// ObserveTake is safe for concurrent use and cheap: one stripe lock, one map lookup and a
// sift in a min-heap of the stripe's pairs (O(log m)), no allocation for a pair already
// tracked, nor for an untracked one, whose identity string is kept (see ObserveTake).
// Report and WantEarly are safe for concurrent use with ObserveTake and with each other
// (Reports are serialized). The zero Table is not usable: build it with NewTable.
type Table struct {
	mu    sync.Mutex // mu guards start and every stripe's spare; serializes Report
	start time.Time  // the current interval's start: NewTable's start, then each Report's now

	cfg     Config
	rate    func(rule *rules.Compiled, identity string, now time.Time) float64
	seed    maphash.Seed
	mask    uint64
	stripes []stripe

	// items and quiet are Report's buffers, kept from one report to the next (guarded by
	// mu): a report of a full table of 20,000 pairs no longer grows a slice of them.
	items []drained
	quiet []entry

	jumped atomic.Bool   // some identity's refusals jumped this interval (see entry.earlyAt)
	early  chan struct{} // cap 1: poked when jumped goes true, so a Reporter need not poll
	startN atomic.Int64  // start as Unix ns, for WantEarly without mu
}

// pair is the key of a tracked count.
type pair struct {
	rule     string
	identity string
}

type stripe struct {
	mu   sync.Mutex // mu guards cur (and all of it) and prev
	cur  *ssTable
	prev map[pair]prevState // last interval's pairs that matter now; read-only
	// spare is the table Report drains into next; owned by Report (guarded by Table.mu).
	spare *ssTable
	_     [64]byte // keep neighbouring stripes' locks off one cache line
}

// ssTable is one stripe's Space-Saving table for one interval.
type ssTable struct {
	m       map[pair]*entry
	slab    []entry  // backing store, len = capacity; entries never move
	heap    []*entry // the pairs tracked; a min-heap by count() once heaped
	total   int64    // tokens observed this interval in this stripe (N_s)
	evicted int64    // pairs evicted this interval
	// heaped: heap is in heap order. Only an eviction needs the minimum, so until the
	// stripe is full its pairs are kept in insertion order and a check moves nothing
	// (most stripes never fill: 10,000 identities an interval fill a sixth of the
	// default Capacity); the insert that first finds it full builds the heap, in O(m).
	heaped bool
}

// entry is one tracked pair. admitted and refused are exact counts since the pair was
// (last) inserted; err bounds what it may have had before that.
type entry struct {
	key      pair
	rule     *rules.Compiled // the latest compiled rule seen for key.rule
	admitted int64
	refused  int64
	err      int64 // the evicted minimum count when the pair was inserted
	earlyAt  int64 // refused above this is a jump; maxInt64 once flagged
	prevRef  int64 // its refusals last interval, scaled to one Interval (jumpedSoFar)
	heap     int   // index in ssTable.heap
	// first is when the pair was (last) inserted, Unix ns; slots are its tokens (admitted
	// and refused) by RecentSlot of time, a ring: the recent rate (see recentRate).
	first int64
	slots [recentSlots]slot
	// lowAt is when a take last left the region's bucket under half its burst
	// (UsageObserver's low), Unix ns; 0: not this interval. See IdentityUsage.draining.
	lowAt int64
}

// slot is one RecentSlot of a pair's tokens: id is the slot's number (Unix ns / RecentSlot).
type slot struct{ id, tokens int64 }

// prevState is what a pair carries from one interval into the next: its refusals (scaled
// to one Interval: what a jump is measured against) and, when it had tokens in the last
// second, its recent slots, so a recent rate spans reports however close they come.
type prevState struct {
	refused int64
	first   int64
	slots   [recentSlots]slot
	rule    *rules.Compiled // for the quiet entry, when the pair has no traffic now
}

// The recent rate: tokens over about the last second, by slots of RecentSlot.
const (
	RecentSlot  = 250 * time.Millisecond
	recentSlots = 4
)

// recent is the pair's rate, tokens per second, over the last recentSlots slots up to now
// (the current one partly), or since it was inserted if later: about the last second; and
// the tokens it counts (the rate × that span), which tell the balancer how sure the rate
// is. Which way it errs: the window is 0.5–1 s long, so a rate that changed within it is
// averaged over that much (under, for a key that arrived less than 0.5 s ago); never a
// count the pair did not have.
func (e *entry) recent(now int64) (rate, tokens float64) {
	cur := now / int64(RecentSlot)
	from := max((cur-recentSlots+1)*int64(RecentSlot), e.first)
	var sum int64
	for _, sl := range e.slots {
		if sl.id > cur-recentSlots && sl.id <= cur {
			sum += sl.tokens
		}
	}
	// A pair first seen a moment ago is measured over at least two slots: one request
	// 10 ms after the last report is not a rate of 100/s.
	length := max(now-from, int64(2*RecentSlot))
	return float64(sum) / (float64(length) / 1e9), float64(sum)
}

// count is the Space-Saving count: an upper bound on the pair's true tokens.
func (e *entry) count() int64 { return e.admitted + e.refused + e.err }

func newSSTable(capacity int) *ssTable {
	return &ssTable{
		m:    make(map[pair]*entry, capacity),
		slab: make([]entry, capacity),
		heap: make([]*entry, 0, capacity),
	}
}

// reset empties t for reuse; the map keeps its buckets, so refilling it allocates nothing.
func (t *ssTable) reset() {
	clear(t.m)
	clear(t.heap[:cap(t.heap)])
	t.heap = t.heap[:0]
	t.heaped = false
	clear(t.slab) // drop references to rules and identity strings
	t.total, t.evicted = 0, 0
}

// NewTable validates cfg and returns an empty Table whose first interval starts at start.
func NewTable(cfg Config, start time.Time) (*Table, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	t := &Table{cfg: cfg, rate: cfg.RegionalRate, seed: maphash.MakeSeed(), start: start,
		mask: uint64(cfg.Stripes - 1), stripes: make([]stripe, cfg.Stripes), early: make(chan struct{}, 1)}
	if t.rate == nil {
		t.rate = defaultRegionalRate
	}
	t.startN.Store(start.UnixNano())
	per := cfg.Capacity / cfg.Stripes
	for i := range t.stripes {
		t.stripes[i].cur, t.stripes[i].spare = newSSTable(per), newSSTable(per)
	}
	return t, nil
}

// ObserveTake counts one enforcing take: tokens admitted when allowed, else refused.
// Every source counts (a refusal from the refusal cache or a fail-closed rule is still
// demand). tokens <= 0 or a nil rule count nothing. The table keeps identity as it is
// while the pair is tracked: it must not be a slice of a larger buffer (the enforcer's
// identities are built by rules.Match).
// low (an admitted take left the region's bucket under half its burst) is remembered
// for the report: a pair with a low take in the recent rate's span is reported draining.
func (t *Table) ObserveTake(rule *rules.Compiled, identity string, tokens int64, allowed, low bool, _ bucket.Source, now time.Time) {
	if tokens <= 0 || rule == nil {
		return
	}
	ns := now.UnixNano()
	s := &t.stripes[maphash.String(t.seed, identity)&t.mask]
	s.mu.Lock()
	tb := s.cur
	tb.total += tokens
	e := tb.m[pair{rule.ID, identity}]
	leaf := false
	if e == nil {
		e, leaf = t.insert(s, tb, rule, identity)
		if e.first == 0 {
			e.first = ns
		}
	} else if e.rule != rule {
		e.rule = rule
	}
	if id := ns / int64(RecentSlot); e.slots[id%recentSlots].id != id {
		e.slots[id%recentSlots] = slot{id: id, tokens: tokens}
	} else {
		e.slots[id%recentSlots].tokens += tokens
	}
	jumped := false
	if allowed {
		e.admitted += tokens
		if low {
			e.lowAt = ns
		}
	} else {
		e.refused += tokens
		if e.refused > e.earlyAt || e.refused >= earlyJump && e.earlyAt != maxInt64 && t.jumpedSoFar(e, ns) {
			e.earlyAt, jumped = maxInt64, true
		}
	}
	switch {
	case !tb.heaped:
	case leaf:
		tb.up(e.heap)
	default:
		tb.down(e.heap)
	}
	s.mu.Unlock()
	if jumped && t.jumped.CompareAndSwap(false, true) {
		select {
		case t.early <- struct{}{}:
		default:
		}
	}
}

const maxInt64 = 1<<63 - 1

// jumpedSoFar says whether e's refusals, at ns, are a jump measured against the part of
// the interval that has passed: its last interval's refusals scaled to the time since
// this interval started, beyond four Poisson standard deviations and earlyJump, and
// EarlyFactor times as many. earlyAt measures a whole interval's refusals: a 50/s key
// whose traffic moved to a region of three enforcers, refused some 15 tokens a second at
// each where it had 7 an interval, passed it about 2 s after the move; against the time
// passed, in a little over one. Not in the first second after a report: a jump found
// then sends a report whose recent second holds little of what changed, which the
// balancer's arrival test passes over, and EarlyGap then holds the next early report
// back 2 s (the demo's globex, first heard: 3 s to its limit, 6 s with no such wait).
func (t *Table) jumpedSoFar(e *entry, ns int64) bool {
	el := ns - t.startN.Load()
	if el < int64(jumpAfter) {
		return false
	}
	want, got := float64(e.prevRef)*float64(el)/float64(t.cfg.Interval), float64(e.refused)
	if got <= want+earlyJump || got <= t.cfg.EarlyFactor*want { // most refusals: no square root
		return false
	}
	return got > want+4*math.Sqrt(want)+earlyJump
}

// earlyJump: refusals jump (Config.EarlyMinRefused) at fewer than EarlyMinRefused tokens
// too, once they are this many and four Poisson standard deviations over the last
// interval's: a 50/s key whose traffic moved to a region of three enforcers holding a
// fifth of it is refused some 15 tokens a second an enforcer, and took 6 s to reach 100
// (its move waited for that or for a regular report, up to an interval). Six, not ten: a
// 100/s key's move into a region holding a quarter of it is refused about 8 a second an
// enforcer, and half a second more to ten was half a second more of every such move
// (docs/design.md §9, "Speed").
const earlyJump = 6

// jumpAfter is how long into an interval jumpedSoFar starts measuring.
const jumpAfter = time.Second

// insert tracks a new pair with zero counts, evicting the stripe's minimum if it is full
// (weighted Space-Saving: the newcomer inherits the evicted count as its error). Called
// with s.mu held; the caller adds the tokens and, once the stripe is heaped, restores the
// heap from e.heap: up when leaf (a new last leaf), else down (the evicted root's count
// only grew).
func (t *Table) insert(s *stripe, tb *ssTable, rule *rules.Compiled, identity string) (e *entry, leaf bool) {
	var inherited int64
	if n := len(tb.heap); n < len(tb.slab) {
		e, leaf = &tb.slab[n], true
		e.heap = n
		tb.heap = append(tb.heap, e)
	} else {
		if !tb.heaped {
			tb.heapify()
		}
		e = tb.heap[0]
		inherited = e.count()
		delete(tb.m, e.key)
		tb.evicted++
	}
	// The caller's identity string is kept as it is, not copied: the enforcer's come from
	// rules.Match, which builds each one (they pin no request buffer) and hands every
	// check of an identity the same string for a while, so the lookups of later checks
	// compare it by pointer instead of reading a copy's bytes from memory.
	key := pair{rule.ID, identity}
	prev := s.prev[key]
	earlyAt := t.cfg.EarlyMinRefused
	if jump := prev.refused + int64(4*math.Sqrt(float64(prev.refused))) + earlyJump; jump < earlyAt {
		earlyAt = jump
	}
	if f := t.cfg.EarlyFactor * float64(prev.refused); f > float64(earlyAt) {
		earlyAt = maxInt64
		if f < float64(maxInt64) {
			earlyAt = int64(f)
		}
	}
	*e = entry{key: key, rule: rule, err: inherited, earlyAt: earlyAt, prevRef: prev.refused, heap: e.heap, first: prev.first, slots: prev.slots}
	tb.m[key] = e
	return e, leaf
}

// heapify puts heap in heap order (bottom-up, O(len)) and marks it heaped.
func (t *ssTable) heapify() {
	for i := len(t.heap)/2 - 1; i >= 0; i-- {
		t.down(i)
	}
	t.heaped = true
}

// up restores the min-heap after heap[i] was appended as a leaf.
func (t *ssTable) up(i int) {
	h := t.heap
	e := h[i]
	c := e.count()
	for i > 0 {
		p := (i - 1) / 2
		if h[p].count() <= c {
			break
		}
		h[i] = h[p]
		h[i].heap = i
		i = p
	}
	h[i] = e
	e.heap = i
}

// down restores the min-heap after the count of heap[i] grew (it can only sink).
func (t *ssTable) down(i int) {
	h := t.heap
	n := len(h)
	e := h[i]
	c := e.count()
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h[r].count() < h[l].count() {
			m = r
		}
		if h[m].count() >= c {
			break
		}
		h[i] = h[m]
		h[i].heap = i
		i = m
	}
	h[i] = e
	e.heap = i
}

// Len returns the pairs tracked in the current interval (at most Config.Capacity).
func (t *Table) Len() int {
	n := 0
	for i := range t.stripes {
		s := &t.stripes[i]
		s.mu.Lock()
		n += len(s.cur.heap)
		s.mu.Unlock()
	}
	return n
}

// Config returns the table's configuration (NewSchedule reads its Interval and EarlyGap).
func (t *Table) Config() Config { return t.cfg }

// Interval returns Config.Interval: the Reporter's period.
func (t *Table) Interval() time.Duration { return t.cfg.Interval }

// Start returns when the current interval began (NewTable's start, then the last Report's
// now).
func (t *Table) Start() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.start
}

// Jumped reports whether some identity's refusals jumped this interval (see WantEarly,
// which also waits for EarlyGap to pass). One atomic load.
func (t *Table) Jumped() bool { return t.jumped.Load() }

// Early returns a channel that receives (capacity 1, never closed) when some identity's
// refusals jump; a Reporter waits on it instead of polling WantEarly. A receive is a hint:
// check WantEarly.
func (t *Table) Early() <-chan struct{} { return t.early }
