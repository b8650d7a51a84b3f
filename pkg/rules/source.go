package rules

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/allot-dev/allot/pkg/clock"
	"github.com/allot-dev/allot/pkg/routine"
	"github.com/hashicorp/go-hclog"
)

// ErrClosed is returned by a source's Run and Reload after Close.
var ErrClosed = errors.New("rules: source closed")

// runErr is what a source's Run returns for the error of its routine.Run: ErrClosed
// after Close, ctx.Err() when its context ended.
func runErr(source string, err error) error {
	switch {
	case errors.Is(err, routine.ErrClosed):
		return ErrClosed
	case errors.Is(err, routine.ErrStarted):
		return fmt.Errorf("rules: %s.Run: %w", source, err)
	}
	return err
}

// Option configures a FileSource or an EtcdSource.
type Option func(*sourceConfig)

type sourceConfig struct {
	clock      clock.Clock
	interval   time.Duration
	timeout    time.Duration
	backoffMin time.Duration
	backoffMax time.Duration
	onError    func(error)
	onLoad     func(*Snapshot)
	logger     hclog.Logger
	base       *Set
}

// DefaultInterval is how often a FileSource looks for a changed file.
const DefaultInterval = 2 * time.Second

func newSourceConfig(opts []Option) sourceConfig {
	c := sourceConfig{
		clock:      clock.Real(),
		interval:   DefaultInterval,
		timeout:    5 * time.Second,
		backoffMin: 100 * time.Millisecond,
		backoffMax: 5 * time.Second,
		logger:     hclog.NewNullLogger(),
	}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// WithClock sets the clock that paces polling and retries and stamps snapshots (default
// the wall clock). Tests pass a *clock.Fake.
func WithClock(c clock.Clock) Option { return func(s *sourceConfig) { s.clock = c } }

// WithInterval sets how often a FileSource reads its file for changes (default
// DefaultInterval; <= 0 keeps the default).
func WithInterval(d time.Duration) Option {
	return func(s *sourceConfig) {
		if d > 0 {
			s.interval = d
		}
	}
}

// WithTimeout bounds each etcd request of an EtcdSource (default 5 s).
func WithTimeout(d time.Duration) Option {
	return func(s *sourceConfig) {
		if d > 0 {
			s.timeout = d
		}
	}
}

// WithBackoff sets the first and the longest wait between an EtcdSource's retries
// (default 100 ms doubling to 5 s).
func WithBackoff(first, most time.Duration) Option {
	return func(s *sourceConfig) {
		if first > 0 && most >= first {
			s.backoffMin, s.backoffMax = first, most
		}
	}
}

// WithOnError sets a hook called (from the source's goroutine, never with a lock held)
// with every error: a rejected rule set or an unreachable etcd. It must not block long.
func WithOnError(f func(error)) Option { return func(s *sourceConfig) { s.onError = f } }

// WithOnLoad sets a hook called after each new snapshot is stored in the Holder.
func WithOnLoad(f func(*Snapshot)) Option { return func(s *sourceConfig) { s.onLoad = f } }

// WithLogger sets the logger (default: none).
func WithLogger(l hclog.Logger) Option {
	return func(s *sourceConfig) {
		if l != nil {
			s.logger = l
		}
	}
}

// WithBase layers an EtcdSource over a base set (typically the file set shipped with the
// enforcer): the snapshot holds the base rules, with each etcd rule replacing the base
// rule of the same id and the others added after them. The base must be valid on its own.
func WithBase(s *Set) Option { return func(c *sourceConfig) { c.base = s } }

// Status is what a source reports for /readyz and metrics.
type Status struct {
	// Version is that of the last snapshot this source stored; "" if none yet.
	Version string
	// LoadedAt is when that snapshot was stored.
	LoadedAt time.Time
	// LastError is the latest error (a rejected set, an unreachable etcd), nil after a
	// later success; ErrorAt says when.
	LastError error
	ErrorAt   time.Time
	// Loads counts snapshots stored; Failures counts errors.
	Loads, Failures uint64
	// Revision is the etcd revision the rules are known at (EtcdSource only).
	Revision int64
	// Refused lists the etcd keys whose rule is refused now (EtcdSource only; see it):
	// each is serving its previous good version, or nothing.
	Refused []RefusedRule
}

// status is the part of a source that Status reads; safe for concurrent use.
type status struct {
	mu sync.Mutex // mu guards st
	st Status
}

func (s *status) get() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st
}

func (s *status) loaded(snap *Snapshot, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.Version, s.st.LoadedAt, s.st.LastError = snap.Version(), at, nil
	s.st.Loads++
}

func (s *status) failed(err error, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.LastError, s.st.ErrorAt = err, at
	s.st.Failures++
}

func (s *status) ok() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.LastError = nil
}

func (s *status) setRefused(r []RefusedRule) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.Refused = r
}

func (s *status) setRevision(rev int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st.Revision = rev
}

// report records and announces an error.
func (c *sourceConfig) report(st *status, err error, msg string, kv ...any) {
	st.failed(err, c.clock.Now())
	c.logger.Warn(msg, append(kv, "error", err)...)
	if c.onError != nil {
		c.onError(err)
	}
}

// store swaps snap into h and records it.
func (c *sourceConfig) store(st *status, h *Holder, snap *Snapshot, msg string, kv ...any) {
	h.Store(snap)
	st.loaded(snap, c.clock.Now())
	c.logger.Info(msg, append(kv, "version", snap.Version(), "rules", snap.Len())...)
	if c.onLoad != nil {
		c.onLoad(snap)
	}
}
