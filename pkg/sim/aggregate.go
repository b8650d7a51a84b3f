package sim

import (
	"time"

	"github.com/allot-dev/allot/pkg/aggregator"
	"github.com/allot-dev/allot/pkg/enforcer/report"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// The balancer plane's report aggregators (Options.Aggregate, docs/design.md §12): one per
// region, merging its enforcers' reports and forwarding one an interval, or sooner when a
// report asks.

// simAggregator is one region's report aggregator in virtual mode.
type simAggregator struct {
	m    *aggregator.Merger
	seq  uint64
	last time.Duration // the last forward, since Epoch
	next time.Duration // the next one (regular, or AckGap after the last when kicked)
	gen  uint64        // forwards so far: a scheduled forward runs only if none came since
	gap  time.Duration // the aggregator's AckGap: an urgent forward waits this after the last
}

// forwardAt schedules region r's aggregator's forward at t, unless another comes first.
func (p *balancerPlane) forwardAt(r int, t time.Duration) {
	if t >= p.sc.Duration {
		return
	}
	a := p.aggs[r]
	gen := a.gen
	p.w.clk.at(t, func() {
		if gen == a.gen {
			p.forward(r)
		}
	})
}

// forward is one pass of the aggregator's loop: the merge of the interval sent to the
// balancer (lost when the region is cut off from it or it is down), the next regular
// forward an Interval on.
func (p *balancerPlane) forward(r int) {
	a := p.aggs[r]
	a.gen++
	el, sentAt := p.w.clk.elapsed(), p.w.clk.Now()
	a.last, a.next = el, el+p.sc.Interval
	p.forwardAt(r, a.next)
	req := a.m.Flush(sentAt)
	if req == nil {
		return
	}
	a.seq++
	req.EnforcerId, req.Seq = "aggregator-"+p.sc.Regions[r].Name, a.seq
	if p.down || p.isolated[r] {
		return
	}
	p.w.clk.at(el+ReportDelay, func() {
		if p.down || p.isolated[r] { // went down, or the region was cut off, on the way
			return
		}
		now := p.w.clk.Now()
		if p.core.Ingest(now, req) != nil {
			return
		}
		resp := &allotv1.ReportResponse{Accepted: true}
		resp.ShareLeaderRev, resp.ShareVersion = p.core.Newest()
		a.m.Confirm(req, sentAt, resp)
		p.kickTick(req)
	})
}

// relay is an enforcer's report reaching its region's aggregator: merged, answered as the
// aggregator answers (what the leader last confirmed), and forwarded at once (AckGap
// after the last forward at the soonest) when it asks for that.
func (p *balancerPlane) relay(m sent) {
	a := p.aggs[m.region]
	now := p.w.clk.Now()
	resp, urgent, err := a.m.Add(now, m.r)
	if err != nil {
		return // as a refused report (see ingest)
	}
	if rep := p.reps[m.region][m.enf]; rep.cgen == m.gen && !p.cutFromAggregator(m.region, m.enf) {
		if acc, ok := report.AcceptanceOf(now, m.r.Seq, resp); ok {
			p.w.effect(func() { rep.rc.Accepted(acc) })
		}
	} else if rep.cgen == m.gen {
		p.answersLost++
	}
	if !urgent {
		return
	}
	el := p.w.clk.elapsed()
	if soon := max(a.last+a.gap, el); soon < a.next {
		a.next = soon
		a.gen++
		p.forwardAt(m.region, soon)
	}
}
