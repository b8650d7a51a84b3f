package balancer

import (
	"testing"
	"time"
)

// An acknowledgement that comes before StepGap has passed cannot release a plan's next
// step; NextTick says when it can, so the service's loop (TickWait) ticks then rather
// than a TickEvery later, while the control plane is quiet. Live, with acknowledgements
// 0.3 s after each version, a move went in steps a second apart.
func TestNextTickIsTheNextStep(t *testing.T) {
	g := newSwapRig(t, true, 30, 120)
	g.swap()
	g.now = g.now.Add(500 * time.Millisecond)
	g.send("us-east", true, false) // the arrival: a shift
	c := g.c
	var p *Publication
	for range 8 { // tick as the service would: at each NextTick
		if p = c.Tick(g.now); p != nil {
			break
		}
		g.now = c.NextTick(g.now)
	}
	if p == nil || p.Head.Phase != "decrease" {
		t.Fatalf("no decrease published: %+v", p)
	}
	c.Published(p, g.now)
	published := g.now
	g.now = g.now.Add(c.cfg.StepGap / 5)
	g.send("eu-west", false, true) // eu-west applied the decrease and says so, at once
	g.send("us-east", false, true)
	if p := c.Tick(g.now); p != nil && p.Changed {
		t.Fatalf("a step %v after the last version, inside StepGap %v", g.now.Sub(published), c.cfg.StepGap)
	}
	next := c.NextTick(g.now)
	if want := published.Add(c.cfg.StepGap); !next.Equal(want) {
		t.Fatalf("NextTick %v after the decrease, want StepGap %v", next.Sub(published), c.cfg.StepGap)
	}
	if w := TickWait(c, g.now, time.Second); w != next.Sub(g.now) {
		t.Fatalf("TickWait %v, want %v", w, next.Sub(g.now))
	}
	// Busy (quickSteps versions in the last interval), the steps wait for TickEvery.
	quiet := c.versionsAt
	for i := range c.versionsAt {
		c.versionsAt[i] = g.now.Add(-time.Second)
	}
	if busy := c.NextTick(g.now); !busy.IsZero() {
		t.Fatalf("%d versions in the last second: NextTick %v after now, want none", quickSteps, busy.Sub(g.now))
	}
	if w := TickWait(c, g.now, time.Second); w != time.Second {
		t.Fatalf("busy: TickWait %v, want TickEvery", w)
	}
	c.versionsAt = quiet
	if p := c.Tick(next); p == nil || !p.Changed {
		t.Fatalf("no step at NextTick (%v after the decrease)", next.Sub(published))
	}
}
