package rules

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/clock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

type rulePos struct{}

// ErrInvalid is wrapped by every parse and validation error.
var ErrInvalid = errors.New("rules: invalid rule set")

func ParseYAML(data []byte) (*Set, error) { return nil, errors.New("TODO") }
func LoadFile(path string) (*Set, error)  { return nil, errors.New("TODO") }
func CheckFile(path string) error         { return errors.New("TODO") }

type CompileOptions struct {
	Region       string
	DefaultShare float64
	IPv6Prefix   int
	Now          time.Time
}

func Compile(s *Set, opt CompileOptions) (*Snapshot, error) { return nil, errors.New("TODO") }

type Compiled struct {
	ID        string
	Mode      Mode
	FailMode  FailMode
	By        By
	Limits    []bucket.Limit
	ExpiresAt time.Time
	Reason    string
	Policy    string
}

type Matched struct {
	Rule     *Compiled
	Identity string
	Cost     int64
}

type Snapshot struct{ version string }

func (s *Snapshot) Version() string                                        { return s.version }
func (s *Snapshot) Created() time.Time                                     { return time.Time{} }
func (s *Snapshot) Len() int                                               { return 0 }
func (s *Snapshot) Match(a *Attrs, now time.Time, dst []Matched) []Matched { return dst }

type Holder struct{ cur atomic.Pointer[Snapshot] }

func NewHolder(initial *Snapshot) *Holder { h := &Holder{}; h.cur.Store(initial); return h }
func (h *Holder) Current() *Snapshot      { return h.cur.Load() }
func (h *Holder) Store(s *Snapshot)       { h.cur.Store(s) }

type Option func(*sourceConfig)
type sourceConfig struct{}

func WithClock(c clock.Clock) Option      { return func(*sourceConfig) {} }
func WithInterval(d time.Duration) Option { return func(*sourceConfig) {} }
func WithOnError(f func(error)) Option    { return func(*sourceConfig) {} }
func WithBase(s *Set) Option              { return func(*sourceConfig) {} }

type Status struct {
	Version   string
	LoadedAt  time.Time
	LastError error
	ErrorAt   time.Time
	Loads     uint64
	Failures  uint64
}

type FileSource struct{}

func NewFileSource(path string, h *Holder, opt CompileOptions, o ...Option) (*FileSource, error) {
	return nil, errors.New("TODO")
}
func (f *FileSource) Reload() error                 { return errors.New("TODO") }
func (f *FileSource) Run(ctx context.Context) error { return errors.New("TODO") }
func (f *FileSource) Close() error                  { return nil }
func (f *FileSource) Status() Status                { return Status{} }

type EtcdSource struct{}

func NewEtcdSource(cli *clientv3.Client, prefix string, h *Holder, opt CompileOptions, o ...Option) (*EtcdSource, error) {
	return nil, errors.New("TODO")
}
func (e *EtcdSource) Run(ctx context.Context) error { return errors.New("TODO") }
func (e *EtcdSource) Close() error                  { return nil }
func (e *EtcdSource) Status() Status                { return Status{} }

func (e *EtcdSource) Load(ctx context.Context) error    { return errors.New("TODO") }
func (h *Holder) Subscribe() (<-chan *Snapshot, func()) { return nil, func() {} }
func ParseRule(data []byte) (*Rule, error)              { return nil, errors.New("TODO") }
