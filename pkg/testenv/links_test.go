package testenv

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// echo serves one line back per line on a loopback listener until the test ends.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(c net.Conn, r *bufio.Reader) (time.Duration, error) {
	began := time.Now()
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return 0, err
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err := r.ReadString('\n')
	return time.Since(began), err
}

// TestLinks: a link adds its latency each way, Blackhole stops data on an open
// connection, Heal resumes it, Cut refuses new connections and Restore accepts again.
// No Docker needed; real time, bounded (a few hundred ms).
func TestLinks(t *testing.T) {
	up := echo(t)
	links := NewLinks(t)
	k := links.Add(t, "a-b", up, 30*time.Millisecond, 0)
	c, err := net.Dial("tcp", k.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	rtt, err := roundTrip(c, r)
	if err != nil {
		t.Fatal(err)
	}
	if rtt < 60*time.Millisecond {
		t.Errorf("round trip %v through a 30 ms link, want ≥ 60 ms", rtt)
	}
	t.Logf("round trip through a 30 ms-each-way link: %v", rtt)

	k.Blackhole(t)
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := c.Write([]byte("lost\n")); err == nil {
		if _, err := r.ReadString('\n'); err == nil {
			t.Error("an answer came through a blackholed link")
		}
	}
	k.Heal(t)
	c.Close()

	k.Cut(t)
	if c2, err := net.DialTimeout("tcp", k.Addr, 500*time.Millisecond); err == nil {
		c2.Close()
		t.Error("dial of a cut link succeeded")
	}
	k.Restore(t)
	c3, err := net.Dial("tcp", k.Addr)
	if err != nil {
		t.Fatalf("dial after Restore: %v", err)
	}
	defer c3.Close()
	if _, err := roundTrip(c3, bufio.NewReader(c3)); err != nil {
		t.Fatalf("round trip after Restore: %v", err)
	}
}
