package rules

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/allot-dev/allot/pkg/envoyrl"
)

// EnvoyDirSource keeps a Holder in step with a directory of envoyproxy/ratelimit
// configuration files (their runtime layout's RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config,
// or any directory): every *.yaml and *.yml file, one domain each unless merged (their
// MERGE_DOMAIN_CONFIG), loaded by pkg/envoyrl and turned into rules by FromEnvoy. It
// loads the directory when created, again on Reload (wire SIGHUP to it) and, while Run
// runs, whenever a file's name or content changes (read every interval; a swapped
// symlink, as their runtime layout and a Kubernetes ConfigMap mount swap one, is seen
// too).
//
// It gives a FileSource's guarantees: a directory that fails to read, or a file that
// fails to parse (naming file and line, every problem of every file at once) or to
// compile, never replaces the snapshot in force — the whole directory is refused, as
// envoyproxy/ratelimit refuses it — and the error is logged, counted in Status, passed
// to the OnError hook and returned by Reload. What envoyproxy/ratelimit accepts but
// ignores, and files of the directory it would read but this source does not (other
// names, subdirectories), are logged as warnings with each change.
//
// Safe for concurrent use. The zero value is not usable: call NewEnvoyDirSource.
type EnvoyDirSource struct {
	p   polled
	dir string
}

// NewEnvoyDirSource loads dir once and stores its snapshot in h; merge merges the files
// of one domain (MERGE_DOMAIN_CONFIG=true) instead of refusing a domain in two files. It
// returns an error (and leaves h alone) if the directory is missing or bad.
func NewEnvoyDirSource(dir string, merge bool, h *Holder, opt CompileOptions, opts ...Option) (*EnvoyDirSource, error) {
	if h == nil {
		return nil, errors.New("rules: NewEnvoyDirSource: nil Holder")
	}
	s := &EnvoyDirSource{dir: dir}
	s.p = polled{
		name: "EnvoyDirSource", what: "envoy-ratelimit directory", from: "envoy-ratelimit directory",
		kv: []any{"dir", dir}, h: h, opt: opt, cfg: newSourceConfig(opts),
		read: func() ([sha256.Size]byte, func() (*Set, error), error) { return readEnvoyDir(dir, merge, s.p.cfg) },
	}
	if err := s.p.start(); err != nil {
		return nil, err
	}
	return s, nil
}

// LoadEnvoyDir loads dir's envoyproxy/ratelimit configuration (merged or not) as
// EnvoyDirSource does, into the equivalent rule set; warnings are what envoyproxy/ratelimit
// accepts but ignores, and what of the directory is not read. Errors name file and line
// and wrap ErrInvalid (a directory that cannot be read does not).
func LoadEnvoyDir(dir string, merge bool) (set *Set, warnings []string, err error) {
	files, skipped, err := envoyrl.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("rules: while reading %s: %w", dir, err)
	}
	cfgs, err := envoyrl.ParseFiles(files, merge)
	if err != nil {
		return nil, nil, invalidEnvoy{err}
	}
	return FromEnvoy(cfgs), envoyWarnings(skipped, cfgs), nil
}

// envoyWarnings are what of a directory is not read, and what its files say that
// envoyproxy/ratelimit accepts but ignores.
func envoyWarnings(skipped []string, cfgs []*envoyrl.Config) []string {
	var out []string
	for _, n := range skipped {
		out = append(out, n+": not read (only *.yaml and *.yml files are; envoyproxy/ratelimit would read it)")
	}
	for _, c := range cfgs {
		out = append(out, c.Warnings...)
	}
	return out
}

func readEnvoyDir(dir string, merge bool, cfg sourceConfig) ([sha256.Size]byte, func() (*Set, error), error) {
	files, skipped, err := envoyrl.ReadDir(dir)
	if err != nil {
		return [sha256.Size]byte{}, nil, fmt.Errorf("rules: while reading %s: %w", dir, err)
	}
	h := sha256.New()
	for _, f := range files {
		h.Write(binary.AppendUvarint(nil, uint64(len(f.Name))))
		h.Write([]byte(f.Name))
		h.Write(binary.AppendUvarint(nil, uint64(len(f.Data))))
		h.Write(f.Data)
	}
	for _, n := range skipped {
		h.Write([]byte{0})
		h.Write([]byte(n))
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum, func() (*Set, error) {
		cfgs, err := envoyrl.ParseFiles(files, merge)
		if err != nil {
			return nil, invalidEnvoy{err}
		}
		for _, w := range envoyWarnings(skipped, cfgs) {
			cfg.logger.Warn("envoy-ratelimit configuration: accepted as envoyproxy/ratelimit accepts it, but not used", "warning", w)
		}
		return FromEnvoy(cfgs), nil
	}, nil
}

// invalidEnvoy is a configuration pkg/envoyrl refused: its message is envoyrl's (file and
// line of every problem), and errors.Is(err, ErrInvalid) holds, as for a bad rule file.
type invalidEnvoy struct{ err error }

func (e invalidEnvoy) Error() string   { return "rules: " + e.err.Error() }
func (e invalidEnvoy) Unwrap() []error { return []error{e.err, ErrInvalid} }

// Reload reads the directory now and, if it is good and changed, stores the new
// snapshot. It returns the error that rejected it, nil otherwise.
func (s *EnvoyDirSource) Reload() error { return s.p.Reload() }

// Run reads the directory every interval (on the source's clock) and reloads it when a
// file changed. It returns ErrClosed after Close, or ctx.Err() when ctx is done. Run may
// be called once.
func (s *EnvoyDirSource) Run(ctx context.Context) error { return s.p.Run(ctx) }

// Status reports the last good version and the last error.
func (s *EnvoyDirSource) Status() Status { return s.p.st.get() }

// Close stops Run and waits for it to return. Idempotent; the Holder keeps its snapshot.
func (s *EnvoyDirSource) Close() error { return s.p.Close() }

func (s *EnvoyDirSource) String() string { return fmt.Sprintf("rules.EnvoyDirSource(%s)", s.dir) }
