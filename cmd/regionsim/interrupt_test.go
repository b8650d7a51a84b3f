package main

import (
	"bytes"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe to write from the run and read from the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestLiveInterrupted (issue 28, item 6): Ctrl-C during a live run printed every second
// not run as an empty progress row and no word of what happened. Now the rows stop at the
// interrupt, the run says how far it got, and the exit status is 1.
func TestLiveInterrupted(t *testing.T) {
	sc := write(t, small) // 40 s
	var out bytes.Buffer
	var errb syncBuffer
	done := make(chan int, 1)
	// Targets nothing listens on: each check fails fast; the schedule still runs.
	go func() {
		done <- run([]string{"run", "-mode", "live", "-scenario", sc, "-targets", "us-east=127.0.0.1:1,eu-west=127.0.0.1:1"}, &out, &errb)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(errb.String(), "t=  1s") { // signal.NotifyContext is set up, two rows printed
		if time.Now().After(deadline) {
			t.Fatalf("no progress within 10s:\n%s", errb.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	var rc int
	select {
	case rc = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the live run did not stop within 10s of SIGINT")
	}
	got := errb.String()
	t.Logf("stderr:\n%s", got)
	if rc != 1 || !regexp.MustCompile(`regionsim: interrupted after \d+s of 40s; the [1-9]\d* whole seconds above: offered [1-9]\d*, admitted 0 \(0\.0%\)`).MatchString(got) {
		t.Fatalf("rc %d, want 1 saying how far it got", rc)
	}
	if strings.Contains(got, "t= 39s") || strings.Count(got, "\nt=") > 10 {
		t.Fatalf("the seconds not run were printed as rows")
	}
}
