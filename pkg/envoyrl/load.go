package envoyrl

// LoadDir and LoadDirMerged: the files of a directory, one domain each or merged.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

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
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, &Error{File: dir, Msg: err.Error()}
	}
	var names []string
	for _, e := range ents {
		n := e.Name()
		ext := filepath.Ext(n)
		if strings.HasPrefix(n, ".") || (ext != ".yaml" && ext != ".yml") {
			continue
		}
		if !e.Type().IsRegular() {
			if fi, err := os.Stat(filepath.Join(dir, n)); err != nil || !fi.Mode().IsRegular() {
				continue
			}
		}
		names = append(names, n)
	}
	sort.Strings(names)
	var (
		errs []error
		cfgs []*Config
	)
	for _, n := range names {
		path := filepath.Join(dir, n)
		data, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, &Error{File: path, Msg: err.Error()})
			continue
		}
		cfg, err := Parse(path, data)
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
// then differ in composite key. It does not change cfgs' Configs unless merge joins some.
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
