package e2e

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Readings of /proc for the load benchmark (load_test.go): CPU time, system calls and
// memory of a process, and the machine's stolen time.

// stealTicks is the machine's CPU time stolen by its hypervisor and its CPU time in all,
// in ticks (the first line of /proc/stat: user nice system idle iowait irq softirq steal
// ...); 0, 0 where it cannot be read. A phase with much stolen time ran on a slower
// machine than its neighbour.
func stealTicks() (steal, total int64) {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0
	}
	for i, v := range f[1:9] {
		n, _ := strconv.ParseInt(v, 10, 64)
		total += n
		if i == 7 {
			steal = n
		}
	}
	return steal, total
}

// procCPU is utime+stime of pid, from /proc/PID/stat (fields 14 and 15, in clock ticks of
// 1/100 s: USER_HZ is 100 on every Linux this runs on).
func procCPU(b *testing.B, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return time.Duration(u+s) * 10 * time.Millisecond
}

// procPeakRSSMiB is pid's peak resident memory so far (/proc/PID/status VmHWM), in MiB;
// 0 where it cannot be read.
func procPeakRSSMiB(pid int) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	return 0
}

// procSyscalls is pid's read and write system calls so far (/proc/PID/io syscr + syscw:
// reads and writes of any kind, sockets included), or 0 where it cannot be read.
func procSyscalls(pid int) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0
	}
	var n int64
	for _, line := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok && (k == "syscr" || k == "syscw") {
			c, _ := strconv.ParseInt(v, 10, 64)
			n += c
		}
	}
	return n
}

// procRSSMiB is pid's resident memory now and at its peak so far (/proc/PID/status VmRSS
// and VmHWM), in MiB; 0 where it cannot be read.
func procRSSMiB(pid int) (rss, peak float64) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		for key, into := range map[string]*float64{"VmRSS:": &rss, "VmHWM:": &peak} {
			if v, ok := strings.CutPrefix(line, key); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
				*into = kb / 1024
			}
		}
	}
	return rss, peak
}

// procRunWait is how long pid's threads have waited, runnable, for a CPU so far: the sum
// over /proc/PID/task/*/schedstat of the second field (ns on a run queue). On a machine
// shared with other work it says how much of a latency was the process not running at
// all. 0 where it cannot be read (threads that exited are not counted).
func procRunWait(pid int) time.Duration {
	dirs, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0
	}
	var sum int64
	for _, d := range dirs {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, d.Name()))
		if err != nil {
			continue
		}
		if f := strings.Fields(string(raw)); len(f) >= 2 {
			ns, _ := strconv.ParseInt(f[1], 10, 64)
			sum += ns
		}
	}
	return time.Duration(sum)
}
