package quota

import (
	"context"
	"sync"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
)

// Counter adds batches to calendar quota counters: *bucket.Redis in production, Memory in
// tests. AddCounters fills each op's Total or Err and returns an error only when none
// could be sent. It is called by one goroutine at a time per Table, but a Counter may be
// shared by several tables (enforcers).
type Counter interface {
	AddCounters(ctx context.Context, ops []bucket.CounterOp) error
}

// View is where other regions' counts enter (the cross-region part): Others is what the
// other regions used of the quota named rule ("<rule id>/<limit name>") by identity in
// the period that starts at periodStart, and this region holds quota − Others. Called on
// the checking goroutine with no lock held, so it must be quick, must not block and must
// be safe for concurrent use. A nil View (one region) is 0.
type View interface {
	Others(now time.Time, identity, rule string, periodStart time.Time) int64
}

// Memory is a Counter in memory: counters shared by every table given it, as one Redis
// would be. Reset forgets them all (a Redis restart without persistence). Safe for
// concurrent use; for tests and single-process use (counters never expire).
type Memory struct {
	mu   sync.Mutex // guards n, fail
	n    map[memKey]int64
	fail error
	adds int
}

type memKey struct {
	identity, name string
	start          int64
}

// NewMemory returns an empty Memory counter.
func NewMemory() *Memory { return &Memory{n: make(map[memKey]int64)} }

// AddCounters implements Counter.
func (m *Memory) AddCounters(_ context.Context, ops []bucket.CounterOp) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.adds++
	if m.fail != nil {
		for i := range ops {
			ops[i].Err = m.fail
		}
		return m.fail
	}
	for i := range ops {
		op := &ops[i]
		k := memKey{op.Identity, op.Name, op.Start.Unix()}
		v := m.n[k] + op.Delta
		v = max(v, op.Floor)
		m.n[k] = v
		op.Total, op.Err = v, nil
	}
	return nil
}

// Get returns a counter's value.
func (m *Memory) Get(identity, name string, start time.Time) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n[memKey{identity, name, start.Unix()}]
}

// Set sets a counter's value (another region's, or a counter that lost counts).
func (m *Memory) Set(identity, name string, start time.Time, v int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.n[memKey{identity, name, start.Unix()}] = v
}

// Reset forgets every counter.
func (m *Memory) Reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.n)
}

// Fail makes every later batch fail with err (nil: answer again).
func (m *Memory) Fail(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fail = err
}

// Batches returns how many batches were sent (AddCounters calls).
func (m *Memory) Batches() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.adds
}
