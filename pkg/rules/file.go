package rules

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"

	"github.com/allot-dev/allot/pkg/routine"
)

// FileSource keeps a Holder in step with a YAML rule file. It loads the file when created,
// again on Reload (wire SIGHUP to it) and, while Run runs, whenever the file's content
// changes (read every interval; an atomic rename or a symlink swap is seen too).
//
// A file that fails to read, parse or validate never replaces the snapshot in force: the
// error is logged, counted in Status, passed to the OnError hook and returned by Reload.
// Run retries a bad file only when its content changes again.
//
// Safe for concurrent use. The zero value is not usable: call NewFileSource.
type FileSource struct {
	p    polled
	path string
}

// NewFileSource loads path once and stores its snapshot in h. It returns an error (and
// leaves h alone) if the file is missing or bad: an enforcer should not start on a rule
// file it cannot read.
func NewFileSource(path string, h *Holder, opt CompileOptions, opts ...Option) (*FileSource, error) {
	if h == nil {
		return nil, errors.New("rules: NewFileSource: nil Holder")
	}
	f := &FileSource{path: path}
	f.p = polled{
		name: "FileSource", what: "rule file", from: "file", kv: []any{"path", path}, h: h, opt: opt, cfg: newSourceConfig(opts),
		read: func() ([sha256.Size]byte, func() (*Set, error), error) {
			data, err := readFileLimited(path)
			if err != nil {
				return [sha256.Size]byte{}, nil, err
			}
			return sha256.Sum256(data), func() (*Set, error) { return parseSet(data, path) }, nil
		},
	}
	if err := f.p.start(); err != nil {
		return nil, err
	}
	return f, nil
}

// Reload reads the file now and, if it is good and its content changed, stores the new
// snapshot. It returns the error that rejected the file, nil otherwise.
func (f *FileSource) Reload() error { return f.p.Reload() }

// Run reads the file every interval (on the source's clock) and reloads it when its content
// changed. It returns ErrClosed after Close, or ctx.Err() when ctx is done. Run may be
// called once.
func (f *FileSource) Run(ctx context.Context) error { return f.p.Run(ctx) }

// Status reports the last good version and the last error.
func (f *FileSource) Status() Status { return f.p.st.get() }

// Close stops Run and waits for it to return. Idempotent: every call waits; the Holder
// keeps its snapshot.
func (f *FileSource) Close() error { return f.p.Close() }

func (f *FileSource) String() string { return fmt.Sprintf("rules.FileSource(%s)", f.path) }

// polled is what FileSource and EnvoyDirSource share: read the input (read returns its
// digest and how to parse it), and when the digest changed, parse and compile it and
// store the snapshot, or report the error and keep the snapshot in force.
type polled struct {
	mu      sync.Mutex // mu guards lastSum; never held while reading
	lastSum [sha256.Size]byte

	reloadMu    sync.Mutex      // reloadMu serialises reloads so two never race to Store; guards readFailing
	readFailing bool            // the last read failed: Run does not report the same outage every tick
	loop        routine.Routine // Run's
	name, what  string          // the source's type, and what it reads ("rule file")
	from        string          // where a loaded snapshot came from, for the log ("file")
	kv          []any           // what its logs say it reads ("path", path)
	read        func() (sum [sha256.Size]byte, parse func() (*Set, error), err error)
	h           *Holder
	opt         CompileOptions
	cfg         sourceConfig
	st          status
}

// start checks the options and loads the input once.
func (p *polled) start() error {
	if _, err := p.opt.withDefaults(); err != nil {
		return err
	}
	_, err := p.reload(true)
	return err
}

// Reload reads the input now and stores its snapshot if it is good and changed.
func (p *polled) Reload() error {
	if p.loop.Closed() {
		return ErrClosed
	}
	_, err := p.reload(true)
	return err
}

// reload reads and compiles the input. force retries content that failed before.
func (p *polled) reload(force bool) (changed bool, err error) {
	p.reloadMu.Lock()
	defer p.reloadMu.Unlock()
	sum, parse, err := p.read()
	if err != nil {
		if force || !p.readFailing {
			p.cfg.report(&p.st, err, p.what+" unreadable; keeping the rules in force", p.kv...)
		}
		p.readFailing = true
		return false, err
	}
	p.readFailing = false
	p.mu.Lock()
	same := sum == p.lastSum
	p.lastSum = sum
	p.mu.Unlock()
	if same && !force {
		return false, nil
	}
	set, err := parse()
	if err == nil {
		opt := p.opt
		opt.Now = p.cfg.clock.Now()
		var snap *Snapshot
		if snap, err = Compile(set, opt); err == nil {
			if cur := p.st.get(); cur.Version == snap.Version() && cur.Version != "" && same {
				p.st.ok()
				return false, nil // unchanged: keep the snapshot (and its Created) in force
			}
			p.cfg.store(&p.st, p.h, snap, "rules loaded from "+p.from, p.kv...)
			return true, nil
		}
	}
	p.cfg.report(&p.st, err, p.what+" rejected; keeping the rules in force", p.kv...)
	return false, err
}

// Run reads the input every interval and reloads it when it changed.
func (p *polled) Run(ctx context.Context) error {
	return runErr(p.name, p.loop.Run(ctx, p.poll))
}

func (p *polled) poll(ctx context.Context) {
	for {
		t := p.cfg.clock.NewTimer(p.cfg.interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		// Errors were reported through the hook and Status; Run keeps going.
		_, _ = p.reload(false)
	}
}

// Close stops Run and waits for it.
func (p *polled) Close() error {
	p.loop.Close()
	return nil
}
