//go:build linux

package loadgen

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// kernelTicker is the open loop's schedule on Linux: a periodic timerfd read through Go's
// poller, so the generator wakes when a send is due to within the kernel's timer slack
// (50 µs by default). A Go timer cannot do that for the open loop's sub-millisecond
// intervals: when the generator has nothing else to run, Go's scheduler sleeps in
// epoll_wait, whose timeout is whole milliseconds, so a 100 µs timer fires up to ~1 ms
// late and the sends it held back go out together. Those bursts were part of the
// latency tail the benchmark measured, for every server alike.
type kernelTicker struct {
	f    *os.File
	stop func() bool
	buf  [8]byte
}

func newTicker(ctx context.Context, interval time.Duration) (ticker, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("loadgen: timerfd_create: %w", err)
	}
	ts := unix.NsecToTimespec(interval.Nanoseconds())
	if err := unix.TimerfdSettime(fd, 0, &unix.ItimerSpec{Interval: ts, Value: ts}, nil); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("loadgen: timerfd_settime: %w", err)
	}
	t := &kernelTicker{f: os.NewFile(uintptr(fd), "loadgen-timerfd")} // non-blocking: pollable
	t.stop = context.AfterFunc(ctx, func() { _ = t.f.SetReadDeadline(time.Now()) })
	return t, nil
}

// wait blocks until the next tick and returns how many ticks have passed since the last
// wait (more than one when the generator itself was late).
func (t *kernelTicker) wait() (int64, error) {
	if _, err := io.ReadFull(t.f, t.buf[:]); err != nil {
		return 0, err
	}
	return int64(binary.NativeEndian.Uint64(t.buf[:])), nil
}

func (t *kernelTicker) close() {
	t.stop()
	t.f.Close()
}
