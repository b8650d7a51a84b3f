// Package poll is the one way allot's tests wait for something another goroutine or a
// real server will make true: a bounded poll, never a fixed sleep. It fails the test with
// what it waited for, the bound, and the condition's last word.
//
// It is its own package so that unit tests can use it without pkg/testenv (and Docker):
// it imports only the standard library.
package poll

import (
	"testing"
	"time"
)

// Interval is how often Until and True check their condition.
const Interval = 10 * time.Millisecond

// Until calls cond every Interval until it returns nil, and returns how long that took.
// If within passes first it fails t (Fatalf, so from the test's goroutine only) with
// "<what>: not within <within>: <cond's last error>".
func Until(t testing.TB, within time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	began := time.Now()
	for {
		err := cond()
		if err == nil {
			return time.Since(began)
		}
		if time.Since(began) > within {
			t.Fatalf("%s: not within %v: %v", what, within, err)
		}
		time.Sleep(Interval)
	}
}

// True is Until for a condition with nothing to say: it fails t with "<what>: not within
// <within>".
func True(t testing.TB, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	began := time.Now()
	for !cond() {
		if time.Since(began) > within {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(Interval)
	}
	return time.Since(began)
}
