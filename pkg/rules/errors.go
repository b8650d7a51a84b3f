package rules

import (
	"errors"
	"fmt"
	"strings"
)

// ErrInvalid is wrapped by every parse and validation error: the rule set was rejected
// whole and nothing of it was applied.
var ErrInvalid = errors.New("rules: invalid rule set")

// Error is one problem found in a rule set. It wraps ErrInvalid. Its message reads
//
//	rules.yaml:14: rule "pro-search": limits[0].rate: -1, must be finite and > 0
//
// leaving out what is unknown (file, line, rule, field).
type Error struct {
	File  string // the file or etcd key the rule came from; "" if none
	Line  int    // 1-based line in File; 0 if unknown
	Rule  string // the rule id; "" if the rule has none (then Index names it)
	Index int    // the rule's position in the set, 0-based
	Field string // the field at fault, e.g. "limits[0].rate"; "" for the whole rule or set
	Msg   string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("rules: ")
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
		}
		b.WriteString(": ")
	} else if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	switch {
	case e.Rule != "":
		fmt.Fprintf(&b, "rule %q: ", e.Rule)
	case e.Field != "" || e.Index > 0:
		fmt.Fprintf(&b, "rule #%d (no id): ", e.Index+1)
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap lets errors.Is(err, ErrInvalid) see every rule error.
func (e *Error) Unwrap() error { return ErrInvalid }

// maxErrors bounds how many problems one rejection lists.
const maxErrors = 20

// errList gathers the errors of a set, so one run of `rules check` shows them all.
type errList struct {
	errs  []error
	extra int
}

func (l *errList) add(err error) {
	if err == nil {
		return
	}
	// Flatten joined errors so the count bound holds.
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			l.add(e)
		}
		return
	}
	if len(l.errs) >= maxErrors {
		l.extra++
		return
	}
	l.errs = append(l.errs, err)
}

func (l *errList) err() error {
	switch {
	case len(l.errs) == 0:
		return nil
	case len(l.errs) == 1 && l.extra == 0:
		return l.errs[0]
	}
	errs := l.errs
	if l.extra > 0 {
		errs = append(errs[:len(errs):len(errs)], fmt.Errorf("%w: and %d more errors", ErrInvalid, l.extra))
	}
	return errors.Join(errs...)
}

// Describe says, for a log line, what an error a source passed to OnError means: rules
// refused (errors.Is(err, ErrInvalid): a bad rule file, a bad etcd rule, refused alone) or
// a source that could not be read (etcd unreachable, a file gone) — not "rejected" for
// both. Either way the rules in force keep serving.
func Describe(err error) string {
	if errors.Is(err, ErrInvalid) {
		return "rules refused; the rules in force keep serving"
	}
	return "rules source unreachable; the rules in force keep serving"
}
