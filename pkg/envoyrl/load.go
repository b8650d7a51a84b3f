package envoyrl

// LoadDir and LoadDirMerged: the files of a directory, one domain each or merged; ReadDir
// and ParseFiles, the two halves of each, for a source that looks for changes before it
// parses.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Bounds on what one directory may hold; more is an error, not a slow start.
const (
	// MaxFileSize is the largest file ReadDir reads.
	MaxFileSize = 32 << 20
	// MaxDirSize is the most bytes ReadDir reads from one directory, all files together.
	MaxDirSize = 64 << 20
	// MaxFiles is the most configuration files one directory may hold.
	MaxFiles = 10_000
)

// File is one configuration file as read: its path (dir joined with its name) and content.
type File struct {
	Name string
	Data []byte
}

// LoadDir loads every *.yaml and *.yml file of dir (not its subdirectories, not dot
// files), in name order, each one domain: a domain in two files is an error, as in
// envoyproxy/ratelimit by default (MERGE_DOMAIN_CONFIG=false). The runtime layout's
// directory is RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config.
func LoadDir(dir string) ([]*Config, error) { return loadDir(dir, false) }

// LoadDirMerged is LoadDir with envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG=true: the
// files of one domain become one Config (in the first file's name), whose top-level
// descriptors must still differ in composite key.
func LoadDirMerged(dir string) ([]*Config, error) { return loadDir(dir, true) }

func loadDir(dir string, merge bool) ([]*Config, error) {
	files, _, err := ReadDir(dir)
	if err != nil {
		return nil, err
	}
	return ParseFiles(files, merge)
}

// ReadDir reads the files LoadDir loads: every regular *.yaml and *.yml file of dir (a
// symbolic link to one counts), in name order. skipped names what it passed over that
// envoyproxy/ratelimit would read (other files, subdirectories); dot files and dot
// directories (a Kubernetes ConfigMap mount's ..data) are not named. A file or
// directory it cannot read, or more than MaxFiles, MaxFileSize or MaxDirSize, is an
// error wrapping ErrInvalid.
func ReadDir(dir string) (files []File, skipped []string, err error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, &Error{File: dir, Msg: err.Error()}
	}
	var names []string
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, ".") {
			continue
		}
		path := filepath.Join(dir, n)
		regular := e.Type().IsRegular()
		if !regular {
			fi, err := os.Stat(path)
			regular = err == nil && fi.Mode().IsRegular()
		}
		if ext := filepath.Ext(n); !regular || (ext != ".yaml" && ext != ".yml") {
			skipped = append(skipped, path)
			continue
		}
		names = append(names, n)
	}
	if len(names) > MaxFiles {
		return nil, nil, &Error{File: dir, Msg: fmt.Sprintf("%d configuration files, more than %d", len(names), MaxFiles)}
	}
	sort.Strings(names)
	var errs []error
	total := 0
	for _, n := range names {
		path := filepath.Join(dir, n)
		data, err := readLimited(path, min(MaxFileSize, MaxDirSize-total))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		total += len(data)
		files = append(files, File{Name: path, Data: data})
	}
	if len(errs) > 0 {
		return nil, skipped, errors.Join(errs...)
	}
	return files, skipped, nil
}

// readLimited reads at most max bytes of path; a longer file is an error.
func readLimited(path string, max int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, &Error{File: path, Msg: err.Error()}
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	switch {
	case err != nil:
		return nil, &Error{File: path, Msg: err.Error()}
	case len(data) > max && max < MaxFileSize:
		return nil, &Error{File: path, Msg: fmt.Sprintf("the directory's files are more than %d bytes together", MaxDirSize)}
	case len(data) > max:
		return nil, &Error{File: path, Msg: fmt.Sprintf("file is larger than %d bytes", MaxFileSize)}
	}
	return data, nil
}

// ParseFiles parses files, in their order, as LoadDir (merge false: a domain in two
// files is an error) or LoadDirMerged (merge true) does. Every problem of every file is
// in the one error, each wrapping ErrInvalid.
func ParseFiles(files []File, merge bool) ([]*Config, error) {
	var (
		errs []error
		cfgs []*Config
	)
	for _, f := range files {
		cfg, err := Parse(f.Name, f.Data)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		cfgs = append(cfgs, cfg)
	}
	out, err := Combine(cfgs, merge)
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// Combine checks a set of parsed configurations as envoyproxy/ratelimit's loader does
// across files (or xDS resources): one domain each, or (merge, MERGE_DOMAIN_CONFIG=true)
// the configurations of one domain merged into the first, whose top-level descriptors must
// then differ in composite key. It does not change cfgs' Configs.
func Combine(cfgs []*Config, merge bool) ([]*Config, error) {
	var (
		errs  []error
		out   []*Config
		byDom = map[string]*Config{}
	)
	for _, cfg := range cfgs {
		first, dup := byDom[cfg.Domain]
		switch {
		case !dup:
			if merge {
				c := *cfg // merging appends to the first: never to the caller's Config
				c.Descriptors = slices.Clip(c.Descriptors)
				c.Warnings = slices.Clip(c.Warnings)
				cfg = &c
			}
			byDom[cfg.Domain] = cfg
			out = append(out, cfg)
		case !merge:
			errs = append(errs, &Error{File: cfg.File, Line: cfg.Line, Msg: fmt.Sprintf(
				"duplicate domain '%s' in config file (also in %s:%d; envoyproxy/ratelimit merges them only with MERGE_DOMAIN_CONFIG=true)",
				cfg.Domain, first.File, first.Line)})
		default:
			have := map[string]*Descriptor{}
			for i := range first.Descriptors {
				have[first.Descriptors[i].CompositeKey()] = &first.Descriptors[i]
			}
			for _, d := range cfg.Descriptors {
				if prev, ok := have[d.CompositeKey()]; ok {
					errs = append(errs, &Error{File: cfg.File, Line: d.Line, Msg: fmt.Sprintf(
						"duplicate descriptor composite key '%s.%s' (also in %s:%d)",
						cfg.Domain, d.CompositeKey(), prev.File, prev.Line)})
					continue
				}
				first.Descriptors = append(first.Descriptors, d)
				have[d.CompositeKey()] = &first.Descriptors[len(first.Descriptors)-1]
			}
			first.Warnings = append(first.Warnings, cfg.Warnings...)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}
