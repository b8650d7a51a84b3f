package testenv

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ory/dockertest/v3"
	dc "github.com/ory/dockertest/v3/docker"
)

// ports hands out loopback ports no other part of this process has been given.
var ports struct {
	mu   sync.Mutex // mu guards used
	used map[int]bool
}

// freePorts returns n distinct ports that are free on 127.0.0.1 right now, chosen at
// random below the kernel's ephemeral range so that outgoing connections (whose local
// ports come from that range) cannot take them before the server binds. Another process
// can still take one first; the constructors detect that and retry on new ports.
func freePorts(n int) ([]int, error) {
	lo, hi := portRange()
	ports.mu.Lock()
	defer ports.mu.Unlock()
	if ports.used == nil {
		ports.used = make(map[int]bool)
	}
	out := make([]int, 0, n)
	for tries := 0; len(out) < n; tries++ {
		if tries > 1000 {
			return nil, fmt.Errorf("testenv: no free loopback port found in [%d, %d) after %d tries", lo, hi, tries)
		}
		p := lo + rand.IntN(hi-lo)
		if ports.used[p] || !canListen(p) {
			continue
		}
		ports.used[p] = true
		out = append(out, p)
	}
	return out, nil
}

func canListen(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// portRange is [lo, hi): the 12,000 ports below the ephemeral range (Linux default
// 32768–60999), never below 10000.
func portRange() (lo, hi int) {
	hi = 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 11000 {
				hi = v
			}
		}
	}
	lo = max(hi-12000, 10000)
	return lo, hi
}

var owner struct {
	once sync.Once
	id   string
}

// ownerID names this test binary: hostname/pid-namespace/pid/start-time. The start time
// tells a live owner from a later process that reused the pid.
func ownerID() string {
	owner.once.Do(func() {
		host, _ := os.Hostname()
		owner.id = fmt.Sprintf("%s/%s/%d/%s", host, pidNamespace(), os.Getpid(), procStart(os.Getpid()))
	})
	return owner.id
}

func pidNamespace() string {
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return "?"
	}
	return ns
}

// procStart is field 22 of /proc/pid/stat (start time in clock ticks since boot), or ""
// when the process does not exist.
func procStart(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // the command name may hold spaces
	if i < 0 {
		return ""
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

// reapLeftovers removes allot-test containers left by test binaries that died before
// their cleanups ran: those past their expiry label, and those whose owner process (on
// this host, in this pid namespace) no longer exists. Owners elsewhere are left alone
// until their expiry. Best effort: errors are ignored.
func reapLeftovers(pool *dockertest.Pool) {
	ctx, cancel := context.WithTimeout(context.Background(), dockerCall)
	defer cancel()
	list, err := pool.Client.ListContainers(dc.ListContainersOptions{
		All: true, Context: ctx, Filters: map[string][]string{"label": {labelKey}},
	})
	if err != nil {
		return
	}
	now := time.Now().Unix()
	for _, c := range list {
		if !leftover(c.Labels, now) {
			continue
		}
		_ = pool.Client.RemoveContainer(dc.RemoveContainerOptions{
			ID: c.ID, Force: true, RemoveVolumes: true, Context: ctx,
		})
	}
}

// leftover decides from a container's labels whether nobody will clean it up.
func leftover(labels map[string]string, now int64) bool {
	if exp, err := strconv.ParseInt(labels[labelExpires], 10, 64); err == nil && now > exp {
		return true
	}
	parts := strings.Split(labels[labelOwner], "/")
	mine := strings.Split(ownerID(), "/")
	if len(parts) != 4 || parts[0] != mine[0] || parts[1] != mine[1] {
		return false // another host or pid namespace: wait for the expiry
	}
	pid, err := strconv.Atoi(parts[2])
	if err != nil {
		return false
	}
	return procStart(pid) != parts[3]
}
