package fallback

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
)

// latencyNext answers every take after a round trip of its shard's latency on a fake
// clock, and records the deadline each call was given.
type latencyNext struct {
	clk *clock.Fake
	mu  sync.Mutex // mu guards lat and got
	lat map[string]time.Duration
	got []time.Duration // deadline - start, per call
	// source is what every answer says it came from (SourceRedis when zero).
	source bucket.Source
}

func (n *latencyNext) Take(ctx context.Context, req *bucket.Request) (bucket.Result, error) {
	start := n.clk.Now()
	dl, _ := ctx.Deadline() // looks at the context: the round trip starts here
	n.mu.Lock()
	d := n.lat[req.Identity[:strings.IndexByte(req.Identity, ':')]]
	n.got = append(n.got, dl.Sub(start))
	n.mu.Unlock()
	n.clk.Advance(d)
	src := n.source
	if src == 0 {
		src = bucket.SourceRedis
	}
	return bucket.Result{Granted: req.Want, Source: src}, nil
}

func (n *latencyNext) lastDeadline() time.Duration {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.got[len(n.got)-1]
}

func adaptiveStore(t *testing.T, edit func(*Config)) (*Store, *latencyNext) {
	t.Helper()
	clk := clock.NewFake(t0)
	next := &latencyNext{clk: clk, lat: map[string]time.Duration{}}
	cfg := DefaultConfig()
	cfg.Clock, cfg.Shard = clk, shardOf
	if edit != nil {
		edit(&cfg)
	}
	s, err := New(next, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, next
}

func (s *Store) mustTake(t *testing.T, id string) {
	t.Helper()
	if _, err := s.Take(context.Background(), req(id, 1e6, 1e6)); err != nil {
		t.Fatal(err)
	}
}

func TestAdaptiveTimeout(t *testing.T) {
	for _, tc := range []struct {
		name     string
		a, b     time.Duration
		edit     func(*Config)
		deadline time.Duration
	}{
		{"fast shards keep Timeout", 300 * time.Microsecond, 500 * time.Microsecond, nil, DefaultTimeout},
		{"every shard slow: 4 × the fastest", 3 * time.Millisecond, 4 * time.Millisecond, nil, 12 * time.Millisecond},
		{"one slow shard is judged by the fast one", 300 * time.Microsecond, 4 * time.Millisecond, nil, DefaultTimeout},
		{"capped at MaxTimeout", 20 * time.Millisecond, 30 * time.Millisecond, nil, DefaultMaxTimeout},
		{"MaxTimeout 0: no adaptation", 3 * time.Millisecond, 4 * time.Millisecond,
			func(c *Config) { c.MaxTimeout = 0 }, DefaultTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, next := adaptiveStore(t, tc.edit)
			next.lat["a"], next.lat["b"] = tc.a, tc.b
			for i := 0; i < 200; i++ { // the EWMA settles
				s.mustTake(t, "a:k")
				s.mustTake(t, "b:k")
			}
			if got := next.lastDeadline(); got < tc.deadline-50*time.Microsecond || got > tc.deadline+50*time.Microsecond {
				t.Fatalf("deadline %v, want ≈ %v", got, tc.deadline)
			}
		})
	}
}

// Answers from a cache below say nothing about round trips and do not move the deadline.
func TestAdaptiveTimeoutIgnoresCachedAnswers(t *testing.T) {
	s, next := adaptiveStore(t, nil)
	next.lat["a"] = 10 * time.Millisecond
	next.source = bucket.SourceLease
	for i := 0; i < 100; i++ {
		s.mustTake(t, "a:k")
	}
	if got := s.timeout(); got != DefaultTimeout {
		t.Fatalf("timeout %v after cached answers only, want %v", got, DefaultTimeout)
	}
}
