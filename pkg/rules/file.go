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
	mu      sync.Mutex // mu guards lastSum; never held while reading
	lastSum [sha256.Size]byte

	reloadMu    sync.Mutex      // reloadMu serialises reloads so two never race to Store; guards readFailing
	readFailing bool            // the last read failed: Run does not report the same outage every tick
	loop        routine.Routine // Run's
	path        string
	h           *Holder
	opt         CompileOptions
	cfg         sourceConfig
	st          status
}

// NewFileSource loads path once and stores its snapshot in h. It returns an error (and
// leaves h alone) if the file is missing or bad: an enforcer should not start on a rule
// file it cannot read.
func NewFileSource(path string, h *Holder, opt CompileOptions, opts ...Option) (*FileSource, error) {
	if h == nil {
		return nil, errors.New("rules: NewFileSource: nil Holder")
	}
	if _, err := opt.withDefaults(); err != nil {
		return nil, err
	}
	f := &FileSource{path: path, h: h, opt: opt, cfg: newSourceConfig(opts)}
	if _, err := f.reload(true); err != nil {
		return nil, err
	}
	return f, nil
}

// Reload reads the file now and, if it is good and its content changed, stores the new
// snapshot. It returns the error that rejected the file, nil otherwise.
func (f *FileSource) Reload() error {
	if f.loop.Closed() {
		return ErrClosed
	}
	_, err := f.reload(true)
	return err
}

// reload reads and compiles the file. force retries content that failed before.
func (f *FileSource) reload(force bool) (changed bool, err error) {
	f.reloadMu.Lock()
	defer f.reloadMu.Unlock()
	data, err := readFileLimited(f.path)
	if err != nil {
		if force || !f.readFailing {
			f.cfg.report(&f.st, err, "rule file unreadable; keeping the rules in force", "path", f.path)
		}
		f.readFailing = true
		return false, err
	}
	f.readFailing = false
	sum := sha256.Sum256(data)
	f.mu.Lock()
	same := sum == f.lastSum
	f.lastSum = sum
	f.mu.Unlock()
	if same && !force {
		return false, nil
	}
	set, err := parseSet(data, f.path)
	if err == nil {
		opt := f.opt
		opt.Now = f.cfg.clock.Now()
		var snap *Snapshot
		if snap, err = Compile(set, opt); err == nil {
			if cur := f.st.get(); cur.Version == snap.Version() && cur.Version != "" && same {
				f.st.ok()
				return false, nil // unchanged: keep the snapshot (and its Created) in force
			}
			f.cfg.store(&f.st, f.h, snap, "rules loaded from file", "path", f.path)
			return true, nil
		}
	}
	f.cfg.report(&f.st, err, "rule file rejected; keeping the rules in force", "path", f.path)
	return false, err
}

// Run reads the file every interval (on the source's clock) and reloads it when its content
// changed. It returns ErrClosed after Close, or ctx.Err() when ctx is done. Run may be
// called once.
func (f *FileSource) Run(ctx context.Context) error {
	return runErr("FileSource", f.loop.Run(ctx, f.poll))
}

func (f *FileSource) poll(ctx context.Context) {
	for {
		t := f.cfg.clock.NewTimer(f.cfg.interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		// Errors were reported through the hook and Status; Run keeps going.
		_, _ = f.reload(false)
	}
}

// Status reports the last good version and the last error.
func (f *FileSource) Status() Status { return f.st.get() }

// Close stops Run and waits for it to return. Idempotent: every call waits; the Holder
// keeps its snapshot.
func (f *FileSource) Close() error {
	f.loop.Close()
	return nil
}

func (f *FileSource) String() string { return fmt.Sprintf("rules.FileSource(%s)", f.path) }
