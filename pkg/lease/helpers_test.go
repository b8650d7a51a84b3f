package lease

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// counting wraps a Store and counts calls and the tokens it granted. Safe for concurrent use.
type counting struct {
	next    bucket.Store
	calls   atomic.Int64
	granted atomic.Int64
	mu      sync.Mutex // mu guards wants and sights
	wants   []int64    // Want of each call, in order
	sights  int        // calls that carried a sighting
}

func (c *counting) Take(ctx context.Context, req *bucket.Request) (bucket.Result, error) {
	c.calls.Add(1)
	c.mu.Lock()
	c.wants = append(c.wants, req.Want)
	if req.Sight != "" {
		c.sights++
	}
	c.mu.Unlock()
	res, err := c.next.Take(ctx, req)
	c.granted.Add(res.Granted)
	return res, err
}

func (c *counting) wantsCopy() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int64(nil), c.wants...)
}

func (c *counting) lastWant() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.wants) == 0 {
		return 0
	}
	return c.wants[len(c.wants)-1]
}

// blocking is a Store whose every Take announces itself on calls and waits for an answer
// on answers (or for ctx to end).
type blocking struct {
	calls   chan *bucket.Request
	answers chan answer
	n       atomic.Int64
}

type answer struct {
	res bucket.Result
	err error
}

func newBlocking() *blocking {
	return &blocking{calls: make(chan *bucket.Request, 100), answers: make(chan answer)}
}

func (b *blocking) Take(ctx context.Context, req *bucket.Request) (bucket.Result, error) {
	b.n.Add(1)
	b.calls <- req
	select {
	case a := <-b.answers:
		return a.res, a.err
	case <-ctx.Done():
		return bucket.Result{}, ctx.Err()
	}
}

// countdown closes reached once hit has been called n times (later calls are counted too).
type countdown struct {
	n       int64
	hits    atomic.Int64
	reached chan struct{}
}

func newCountdown(n int64) *countdown { return &countdown{n: n, reached: make(chan struct{})} }

func (c *countdown) hit() {
	if c.hits.Add(1) == c.n {
		close(c.reached)
	}
}

// recorder is an Observer that counts events.
type recorder struct {
	n      [EventEvicted + 1]atomic.Int64
	tokens [EventEvicted + 1]atomic.Int64
}

func (r *recorder) observe(ev Event, tokens int64) {
	r.n[ev].Add(1)
	r.tokens[ev].Add(tokens)
}

type fixture struct {
	t     *testing.T
	clk   *clock.Fake
	mem   *bucket.Memory
	next  *counting
	s     *Store
	rec   *recorder
	peers atomic.Int64
}

// newFixture builds a Store over a counting Memory store on a fake clock.
func newFixture(t *testing.T, mod func(*Config)) *fixture {
	t.Helper()
	f := &fixture{t: t, clk: clock.NewFake(t0), rec: &recorder{}}
	f.mem = bucket.NewMemory(f.clk, 0)
	f.next = &counting{next: f.mem}
	f.peers.Store(1)
	f.s = f.store(f.next, mod, hooks{})
	return f
}

func (f *fixture) store(next bucket.Store, mod func(*Config), h hooks) *Store {
	f.t.Helper()
	cfg := DefaultConfig()
	cfg.Clock = f.clk
	cfg.Peers = func() int { return int(f.peers.Load()) }
	cfg.Observer = f.rec.observe
	if mod != nil {
		mod(&cfg)
	}
	s, err := newStore(next, cfg, h)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { s.Close() })
	return s
}

func (f *fixture) take(s *Store, req *bucket.Request) bucket.Result {
	f.t.Helper()
	res, err := s.Take(context.Background(), req)
	if err != nil {
		f.t.Fatalf("Take(%q): %v", req.Identity, err)
	}
	return res
}

// settle waits until no background refill is queued or in flight.
func (s *Store) settle() { s.bg.Wait() }

// held reports the tokens the table holds for key (after expiry at the store's now).
func (s *Store) heldFor(key string) int64 {
	sh := s.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[key]
	if e == nil {
		return 0
	}
	e.expire(s.now())
	return e.held()
}

// batchFor reports the batch of key's last lease call.
func (s *Store) batchFor(key string) int64 {
	sh := s.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.m[key]; e != nil {
		return e.batch
	}
	return 0
}

// opens checks r twice at now, as a key's first two checks: the first calls for the opening
// lot (twice its cost) and is answered by the store, the second is spent from the lot
// without a call.
func (f *fixture) opens(r *bucket.Request) {
	f.t.Helper()
	calls := f.next.calls.Load()
	if res := f.take(f.s, r); res.Granted != r.Want || res.Source != bucket.SourceMemory || f.next.lastWant() != 2*r.Want {
		f.t.Fatalf("first check: %+v asked %d, want granted %d from the store, asking %d (the opening lot)", res, f.next.lastWant(), r.Want, 2*r.Want)
	}
	if res := f.take(f.s, r); res.Granted != r.Want || res.Source != bucket.SourceLease || f.next.calls.Load() != calls+1 {
		f.t.Fatalf("second check: %+v after %d calls, want granted %d from the opening lot, no call", res, f.next.calls.Load()-calls, r.Want)
	}
}

func req(id string, rate, burst float64, cost int64) *bucket.Request {
	return &bucket.Request{
		Identity: id,
		Limits:   []bucket.Limit{{Name: "s", Rate: rate, Burst: burst}},
		Want:     cost,
	}
}
