package app

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

func TestApplyRuntime(t *testing.T) {
	prev := debug.SetGCPercent(100)
	defer debug.SetGCPercent(prev)
	cfg := DefaultConfig()
	cfg.GCHeapFloorMiB = 0
	got, stop := ApplyRuntime(&cfg, env(nil))
	stop()
	if got != "gc_percent 400" {
		t.Fatalf("ApplyRuntime = %q", got)
	}
	if p := debug.SetGCPercent(100); p != DefaultGCPercent {
		t.Fatalf("GC percent %d after ApplyRuntime, want %d", p, DefaultGCPercent)
	}
	// GOGC in the environment wins: the runtime has applied it already, and no floor is
	// tuned on top of it.
	cfg = DefaultConfig()
	got, stop = ApplyRuntime(&cfg, env(map[string]string{"GOGC": "150"}))
	stop()
	if !strings.Contains(got, "GOGC=150") {
		t.Fatalf("ApplyRuntime with GOGC set = %q", got)
	}
	if p := debug.SetGCPercent(100); p != 100 {
		t.Fatalf("GC percent %d after ApplyRuntime with GOGC set, want it left at 100", p)
	}
}

func TestGCPercentFor(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		name             string
		floor            uint64
		base             int
		live, roots      uint64
		want             int
		goalAtLeastFloor bool
	}{
		{"small live heap: raised so the goal is the floor", 256 * mib, 400, 10 * mib, 1 * mib, 2236, true},
		{"the roots count: a goal of live + (live+roots)×p", 256 * mib, 400, 10 * mib, 10 * mib, 1230, true},
		{"live past floor/(1+base): base alone", 256 * mib, 400, 60 * mib, 0, 400, false},
		{"live over the floor: base", 256 * mib, 400, 300 * mib, 0, 400, false},
		{"nothing marked yet: base", 256 * mib, 400, 0, 0, 400, false},
		{"a tiny heap is capped", 1 << 40, 400, 1, 0, maxFloorPercent, false},
	} {
		got := gcPercentFor(c.floor, c.base, c.live, c.roots)
		if got != c.want {
			t.Errorf("%s: gcPercentFor = %d, want %d", c.name, got, c.want)
		}
		goal := c.live + (c.live+c.roots)*uint64(got)/100
		if c.goalAtLeastFloor && (goal > c.floor || c.floor-goal > c.live+c.roots) {
			t.Errorf("%s: goal %d MiB, want the floor (%d MiB) to within one percent step", c.name, goal/mib, c.floor/mib)
		}
	}
}

// TestHeapFloorFollowsCollections: the floor re-tunes GOGC after every collection (its
// cleanup chain re-arms itself) and stops when told.
func TestHeapFloorFollowsCollections(t *testing.T) {
	prev := debug.SetGCPercent(100)
	defer debug.SetGCPercent(prev)
	f := newHeapFloor(1<<30, 400)
	set := make(chan int, 16)
	f.onCollected = func(p int) {
		select {
		case set <- p:
		default:
		}
	}
	f.arm()
	for i := range 3 {
		runtime.GC()
		select {
		case p := <-set:
			// A test binary's live heap is a few MB: the floor of 1 GiB needs GOGC far above 400.
			if p <= 400 {
				t.Fatalf("collection %d: GOGC set to %d, want it raised above 400 for a 1 GiB floor", i, p)
			}
			if cur := debug.SetGCPercent(p); cur != p {
				t.Fatalf("collection %d: GOGC is %d, want %d", i, cur, p)
			}
		case <-time.After(10 * time.Second): // a bound on a wait for an event, not a sleep
			t.Fatalf("collection %d: the floor did not run after runtime.GC", i)
		}
	}
	f.stop()
	runtime.GC() // the chain's last cleanup sees stop and does not re-arm
	runtime.GC()
	select {
	case p := <-set:
		t.Fatalf("GOGC set to %d after stop", p)
	default:
	}
}

func TestGCPercentValidated(t *testing.T) {
	for _, args := range [][]string{{"-gc-percent", "0"}, {"-gc-percent", "-1"}, {"-gc-heap-floor-mib", "-1"}} {
		_, err := Parse(append([]string{"-region", "r"}, args...), env(nil), nil)
		if err == nil || !strings.Contains(err.Error(), strings.ReplaceAll(strings.TrimPrefix(args[0], "-"), "-", "_")) {
			t.Errorf("%v: %v, want an error naming the field", args, err)
		}
	}
	cfg, err := Parse([]string{"-region", "r", "-rules-file", "rules.yaml", "-gc-percent", "200", "-gc-heap-floor-mib", "0"}, env(nil), nil)
	if err != nil || cfg.GCPercent != 200 || cfg.GCHeapFloorMiB != 0 {
		t.Fatalf("-gc-percent 200 -gc-heap-floor-mib 0: %v %d %d", err, cfg.GCPercent, cfg.GCHeapFloorMiB)
	}
}
