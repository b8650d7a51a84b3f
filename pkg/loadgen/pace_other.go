//go:build !linux

package loadgen

import (
	"context"
	"time"
)

// timerTicker is the open loop's schedule where there is no timerfd: a Go timer per tick,
// which may fire late by the scheduler's idle granularity (see pace_linux.go).
type timerTicker struct {
	ctx      context.Context
	start    time.Time
	interval time.Duration
	seen     int64
}

func newTicker(ctx context.Context, interval time.Duration) (ticker, error) {
	return &timerTicker{ctx: ctx, start: time.Now(), interval: interval}, nil
}

func (t *timerTicker) wait() (int64, error) {
	next := t.start.Add(time.Duration(t.seen+1) * t.interval)
	if d := time.Until(next); d > 0 {
		tm := time.NewTimer(d)
		select {
		case <-tm.C:
		case <-t.ctx.Done():
			tm.Stop()
			return 0, t.ctx.Err()
		}
	}
	n := int64(time.Since(t.start) / t.interval)
	ticks := n - t.seen
	t.seen = n
	return ticks, nil
}

func (t *timerTicker) close() {}
