package clock

import (
	"testing"
	"time"
)

func TestFakeAdvanceFiresDueTimersOnly(t *testing.T) {
	start := time.Unix(1000, 0)
	f := NewFake(start)
	early, late := f.NewTimer(time.Second), f.NewTimer(3*time.Second)
	if f.Timers() != 2 {
		t.Fatalf("timers=%d, want 2", f.Timers())
	}
	f.Advance(2 * time.Second)
	select {
	case got := <-early.C():
		if !got.Equal(start.Add(2 * time.Second)) {
			t.Fatalf("fired at %v", got)
		}
	default:
		t.Fatal("early timer did not fire")
	}
	select {
	case <-late.C():
		t.Fatal("late timer fired early")
	default:
	}
	if !late.Stop() || late.Stop() {
		t.Fatal("Stop should report true once, then false")
	}
	f.Advance(time.Hour)
	select {
	case <-late.C():
		t.Fatal("stopped timer fired")
	default:
	}
}

func TestFakeNeverGoesBackwards(t *testing.T) {
	f := NewFake(time.Unix(1000, 0))
	f.Set(time.Unix(10, 0))
	if got := f.Now(); !got.Equal(time.Unix(1000, 0)) {
		t.Fatalf("Now=%v after Set to the past", got)
	}
	if tm := f.NewTimer(0); len(tm.C()) != 1 {
		t.Fatal("a zero-duration timer should fire at once")
	}
}
