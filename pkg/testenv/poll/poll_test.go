package poll

import (
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"
)

// fatal records the Fatalf a failing poll makes, and ends the goroutine as t.Fatalf does.
type fatal struct {
	testing.TB
	msg string
}

func (f *fatal) Helper() {}

func (f *fatal) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// failing runs poll with a recorder in its own goroutine and returns what it failed with
// ("" if it returned).
func failing(t *testing.T, poll func(tb testing.TB)) string {
	f := &fatal{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); poll(f) }()
	<-done
	return f.msg
}

func TestPoll(t *testing.T) {
	for _, tc := range []struct {
		name string
		poll func(tb testing.TB)
		want string // the failure; "" for none
	}{
		{"True: holds at once", func(tb testing.TB) { True(tb, time.Second, "x", func() bool { return true }) }, ""},
		{"True: holds at the third check", func(tb testing.TB) {
			n := 0
			True(tb, time.Minute, "x", func() bool { n++; return n == 3 })
		}, ""},
		{"True: never", func(tb testing.TB) { True(tb, time.Nanosecond, "the sky", func() bool { return false }) },
			"the sky: not within 1ns"},
		{"Until: holds at the second check", func(tb testing.TB) {
			n := 0
			Until(tb, time.Minute, "x", func() error {
				if n++; n < 2 {
					return errors.New("not yet")
				}
				return nil
			})
		}, ""},
		{"Until: never, with the last error", func(tb testing.TB) {
			n := 0
			Until(tb, time.Nanosecond, "3 peers", func() error { n++; return fmt.Errorf("%d peers", n) })
		}, "3 peers: not within 1ns: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := failing(t, tc.poll)
			if (tc.want == "") != (got == "") || len(got) < len(tc.want) || got[:len(tc.want)] != tc.want {
				t.Fatalf("failed with %q, want %q", got, tc.want)
			}
		})
	}
}
