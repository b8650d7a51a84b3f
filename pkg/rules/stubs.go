package rules

import (
	"context"
	"errors"
	"time"

	"github.com/allot-dev/allot/pkg/clock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

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

func (e *EtcdSource) Load(ctx context.Context) error { return errors.New("TODO") }
