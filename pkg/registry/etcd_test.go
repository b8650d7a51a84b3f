package registry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/allot-dev/allot/pkg/testenv/poll"
)

// The tests below run against real etcd (pkg/testenv) and skip under -short.

const testTTL = 2 * time.Second // etcd's minimum lease TTL with default timing

// startReg starts a registry in region/id on cli, closed at cleanup, and fails t unless
// it registers within 10s.
func startReg(t *testing.T, cli *clientv3.Client, prefix, region, id string) *Registry {
	t.Helper()
	r := newReg(t, cli, prefix, region, id)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Start(ctx); err != nil {
		t.Fatalf("Start %s/%s: %v", region, id, err)
	}
	return r
}

func newReg(t *testing.T, cli *clientv3.Client, prefix, region, id string) *Registry {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Prefix, cfg.Region, cfg.ID, cfg.Addr = prefix, region, id, "127.0.0.1:"+id
	cfg.TTL = testTTL
	cfg.BackoffMax = 500 * time.Millisecond
	cfg.Logger = testLogger(t, region+"/"+id)
	r, err := New(cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// peersAre is a poll.Until condition: every registry in rs sees n peers and is healthy.
func peersAre(n int, rs ...*Registry) func() error {
	return func() error {
		for _, r := range rs {
			if got := r.Peers(); got != n {
				return fmt.Errorf("%s sees %d peers, want %d (members %v)", r.key, got, n, r.Members())
			}
			if err := r.Healthy(); err != nil {
				return err
			}
		}
		return nil
	}
}

func ids(ms []Member) string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

func TestMembership(t *testing.T) {
	e := testenv.Etcd(t, 1)
	cli := e.Client(t)

	t.Run("count per region, close, death", func(t *testing.T) {
		const p = "/t1/"
		a1 := newReg(t, cli, p, "A", "a1")
		var changes []int // N as OnChange reported it, from a1's goroutine
		var mu sync.Mutex
		a1.OnChange(func(n int) { mu.Lock(); changes = append(changes, n); mu.Unlock() })
		if err := a1.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		a2 := startReg(t, cli, p, "A", "a2")
		a3 := startReg(t, cli, p, "A", "a3")
		b1 := startReg(t, cli, p, "B", "b1")
		d := poll.Until(t, 5*time.Second, "3 in A", peersAre(3, a1, a2, a3))
		poll.Until(t, time.Second, "1 in B", peersAre(1, b1))
		t.Logf("all peers seen %v after the last Start", d)
		if got := ids(a1.Members()); got != "a1 a2 a3" {
			t.Fatalf("A members = %v", got)
		}
		if m := b1.Members(); len(m) != 1 || m[0].Addr != "127.0.0.1:b1" || m[0].Region != "B" || m[0].Lease == 0 {
			t.Fatalf("B members = %+v", m)
		}

		began := time.Now()
		if err := a3.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		closeTook := time.Since(began)
		seen := poll.Until(t, time.Second, "others see a3 leave", peersAre(2, a1, a2))
		t.Logf("Close took %v; peers saw it %v later", closeTook, seen)

		// A process that dies: its client goes away without revoking.
		dcli := e.Client(t)
		a4 := startReg(t, dcli, p, "A", "a4")
		poll.Until(t, 2*time.Second, "a4 seen", peersAre(3, a1, a2))
		began = time.Now()
		_ = dcli.Close()
		gone := poll.Until(t, testTTL+3*time.Second, "a4 expires", peersAre(2, a1, a2))
		t.Logf("a dead enforcer disappeared %v after its client closed (TTL %v)", gone, testTTL)
		if gone < testTTL/2 {
			t.Fatalf("a4 disappeared after %v, before its lease could expire", gone)
		}
		if err := a4.Healthy(); err == nil {
			t.Fatalf("a4 Healthy with its client closed")
		}
		_ = a4.Close() // its revoke fails: the client is closed
		poll.Until(t, time.Second, "still 1 in B", peersAre(1, b1))
		mu.Lock()
		defer mu.Unlock()
		// Joins may arrive in one watch response, so only the shape is fixed.
		if len(changes) < 3 || changes[len(changes)-1] != 2 || !slices.Contains(changes, 3) || slices.Contains(changes, 1) {
			t.Fatalf("a1's OnChange saw %v, want changes through 3 ending at 2", changes)
		}
	})

	t.Run("duplicate id", func(t *testing.T) {
		const p = "/t2/"
		first := startReg(t, cli, p, "A", "x")
		second := newReg(t, cli, p, "A", "x")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		began := time.Now()
		err := second.Start(ctx)
		if !errors.Is(err, ErrDuplicateID) {
			t.Fatalf("second Start = %v, want ErrDuplicateID", err)
		}
		t.Logf("duplicate reported after %v: %v", time.Since(began), err)
		if h := second.Healthy(); !errors.Is(h, ErrDuplicateID) {
			t.Fatalf("second Healthy = %v", h)
		}
		if first.Peers() != 1 || second.Peers() != 2 || first.Healthy() != nil {
			t.Fatalf("Peers first %d second %d (want 1, 2: the unregistered one counts itself); first Healthy %v",
				first.Peers(), second.Peers(), first.Healthy())
		}
		// When the holder leaves, the other takes the id over.
		if err := first.Close(); err != nil {
			t.Fatal(err)
		}
		d := poll.Until(t, 3*time.Second, "second registers", peersAre(1, second))
		t.Logf("second registered %v after the first closed", d)
	})

	t.Run("restart after crash takes over the id", func(t *testing.T) {
		const p = "/t3/"
		other := startReg(t, cli, p, "A", "o")
		dcli := e.Client(t)
		old := startReg(t, dcli, p, "A", "r")
		poll.Until(t, 2*time.Second, "both seen", peersAre(2, other, old))
		_ = dcli.Close() // crash: the lease is not revoked
		began := time.Now()
		again := startReg(t, cli, p, "A", "r") // waits for the old lease to expire
		took := time.Since(began)
		t.Logf("restarted enforcer registered after %v (old lease TTL %v)", took, testTTL)
		poll.Until(t, time.Second, "two again", peersAre(2, other, again))
		_ = old.Close()
	})
}

// TestEtcdOutage stops the only etcd member for longer than the lease TTL: Healthy
// reports it, Peers keeps the last count, and when etcd returns every enforcer
// registers again under a new lease and the old ones are revoked.
func TestEtcdOutage(t *testing.T) {
	e := testenv.Etcd(t, 1)
	cli := e.Client(t)
	const p = "/out/"
	rs := []*Registry{
		startReg(t, cli, p, "A", "a1"),
		startReg(t, cli, p, "A", "a2"),
		startReg(t, e.Client(t), p, "A", "a3"),
	}
	poll.Until(t, 5*time.Second, "3 in A", peersAre(3, rs...))
	oldLeases := map[int64]bool{}
	for _, m := range rs[0].Members() {
		oldLeases[m.Lease] = true
	}

	began := time.Now()
	e.Members[0].Stop(t)
	t.Logf("etcd stopped in %v", time.Since(began))
	trouble := poll.Until(t, testTTL+3*time.Second, "every registry reports trouble", func() error {
		for _, r := range rs {
			if r.Healthy() == nil {
				return fmt.Errorf("%s still healthy", r.key)
			}
		}
		return nil
	})
	lost := poll.Until(t, testTTL+5*time.Second, "keep-alives lost", func() error {
		for _, r := range rs {
			if err := r.Healthy(); !errors.Is(err, ErrNotRegistered) {
				return fmt.Errorf("%s: %v", r.key, err)
			}
			if r.Peers() != 3 {
				return fmt.Errorf("%s: Peers %d during the outage, want the last known 3", r.key, r.Peers())
			}
		}
		return nil
	})
	t.Logf("trouble reported %v after the stop; registrations lost %v later: %v", trouble, lost, rs[0].Healthy())

	began = time.Now()
	e.Members[0].Start(t)
	restarted := time.Since(began)
	back := poll.Until(t, 10*time.Second, "registered again", func() error {
		if err := peersAre(3, rs...)(); err != nil {
			return err
		}
		ms := rs[0].Members()
		if len(ms) != 3 {
			return fmt.Errorf("members %v", ms)
		}
		for _, m := range ms {
			if oldLeases[m.Lease] {
				return fmt.Errorf("%s still on its old lease %x", m.ID, m.Lease)
			}
		}
		return nil
	})
	t.Logf("etcd started in %v; all re-registered %v after that", restarted, back)
	poll.Until(t, 3*time.Second, "old leases revoked", func() error {
		for id := range oldLeases {
			ttl, err := cli.TimeToLive(context.Background(), clientv3.LeaseID(id))
			if err != nil {
				return err
			}
			if ttl.TTL != -1 {
				return fmt.Errorf("old lease %x still has TTL %d", id, ttl.TTL)
			}
		}
		return nil
	})
}

// TestThreeMembers: losing one etcd member of three is invisible to registrations.
func TestThreeMembers(t *testing.T) {
	e := testenv.Etcd(t, 3)
	cli := e.Client(t)
	const p = "/three/"
	a1 := startReg(t, cli, p, "A", "a1")
	a2 := startReg(t, cli, p, "A", "a2")
	poll.Until(t, 5*time.Second, "2 in A", peersAre(2, a1, a2))
	e.Members[0].Stop(t)
	a3 := startReg(t, cli, p, "A", "a3")
	poll.Until(t, 5*time.Second, "3 in A with a member down", peersAre(3, a1, a2, a3))
	// Through more than a TTL, nobody loses its registration.
	deadline := time.Now().Add(testTTL + time.Second)
	for time.Now().Before(deadline) {
		for _, r := range []*Registry{a1, a2, a3} {
			if errors.Is(r.Healthy(), ErrNotRegistered) {
				t.Fatalf("%s lost its registration with 2 of 3 members up: %v", r.key, r.Healthy())
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := peersAre(3, a1, a2, a3)(); err != nil {
		t.Fatal(err)
	}
}
