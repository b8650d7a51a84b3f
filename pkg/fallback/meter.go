package fallback

import (
	"sync/atomic"
	"time"
)

// meter tells when this process was not running: a goroutine of the Store ticks every
// meterTick on the real clock, and a gap between ticks longer than stallGap means the
// process (or at least its scheduler) was stalled — GC, a loaded host, a paused VM. A call
// whose reply was missing at its deadline is evidence against its shard only if no such
// stall ended since the call was sent and none is under way (the last tick is recent):
// otherwise the reply may have been sitting in the socket, unread.
//
// Which way it errs: slower to trip, never quicker. On a host so loaded that stalls over
// stallGap come every ReplyTimeout, a dead shard keeps its breaker closed (each check waits
// Timeout, and at most MaxInFlight calls are in flight) until a window passes without one.
//
// The zero value is a meter that never saw a stall. Safe for concurrent use.
type meter struct {
	last     atomic.Int64 // Unix µs of the latest tick; 0: not running (no stall claimed)
	stallEnd atomic.Int64 // Unix µs when the latest stall over stallGap ended
	gap      int64        // µs
}

const meterTick = 5 * time.Millisecond

// tick records a tick at now.
func (m *meter) tick(now int64) {
	if last := m.last.Load(); last != 0 && now-last > m.gap {
		m.stallEnd.Store(now)
	}
	m.last.Store(now)
}

// stalledSince reports whether the process stalled after sent (µs), or is stalled now.
func (m *meter) stalledSince(sent, now int64) bool {
	last := m.last.Load()
	return m.stallEnd.Load() > sent || (last != 0 && now-last > m.gap)
}

// runMeter ticks m until the Store closes.
func (s *Store) runMeter() {
	defer s.wg.Done()
	t := time.NewTicker(meterTick)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case now := <-t.C:
			s.meter.tick(now.UnixMicro())
		}
	}
}
