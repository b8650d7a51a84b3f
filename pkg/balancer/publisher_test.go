package balancer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/contract"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// Against a real etcd: a version rewrites only the chunks whose entries changed, the head
// names each chunk's version, and a new leader reading it back (load) gets the whole set;
// a fenced write makes the next version write every chunk.
func TestPublisherWritesChangedChunks(t *testing.T) {
	e := testenv.Etcd(t, 1)
	cli := e.Client(t)
	ctx := context.Background()
	const elKey = "/test/election/leader"
	put, err := cli.Put(ctx, elKey, "me")
	if err != nil {
		t.Fatal(err)
	}
	p := &publisher{cli: cli, prefix: "/test/shares/", key: elKey, rev: put.Header.Revision,
		maxBytes: 1 << 10, timeout: 5 * time.Second, m: newMetrics(prometheus.NewRegistry(), nil)}
	chunkWrites := func() float64 { return testutil.ToFloat64(p.m.writes.WithLabelValues("chunk", "ok")) }
	es := make([]contract.Entry, 200)
	for i := range es {
		es[i] = contract.Entry{Rule: "default", Identity: fmt.Sprintf("key:%03d", i), Shares: map[string]float64{"us-east": 0.5, "eu-west": 0.5}}
	}
	pub := func(ver uint64) *Publication {
		return &Publication{Changed: true, Entries: es, Head: contract.Head{LeaderRev: p.rev, Version: ver, Entries: len(es), Regions: []string{"us-east", "eu-west"}}}
	}
	if err := p.write(ctx, pub(1)); err != nil {
		t.Fatal(err)
	}
	first := chunkWrites()
	if first < 8 {
		t.Fatalf("first version: %v chunk writes, want every chunk (≥ 8 of 1 KiB for 200 entries)", first)
	}
	es[42].Shares = map[string]float64{"us-east": 0.9, "eu-west": 0.1}
	if err := p.write(ctx, pub(2)); err != nil {
		t.Fatal(err)
	}
	if n := chunkWrites() - first; n != 1 {
		t.Fatalf("one entry changed: %v chunk writes, want 1", n)
	}
	head, got, members, membersOK, found, err := p.load(ctx, hclog.NewNullLogger())
	if err != nil || !found {
		t.Fatalf("load: found %v err %v", found, err)
	}
	if membersOK || members.Regions != nil {
		t.Fatalf("no members written, read back %+v (ok %v)", members, membersOK)
	}
	// Members go with a publication that carries them, and read back whole.
	mp := pub(2)
	mp.Members = &contract.Members{LeaderRev: p.rev, Regions: map[string][]string{"us-east": {"us-east-0", "us-east-1"}, "eu-west": {"eu-west-0"}}}
	if err := p.write(ctx, mp); err != nil {
		t.Fatal(err)
	}
	if _, _, members, membersOK, _, err = p.load(ctx, hclog.NewNullLogger()); err != nil || !membersOK || len(members.Regions["us-east"]) != 2 || members.Regions["eu-west"][0] != "eu-west-0" {
		t.Fatalf("members read back %+v (ok %v, err %v)", members, membersOK, err)
	}
	// Unreadable members are reported as such (the new leader then assumes the most).
	if _, err := cli.Put(ctx, contract.MembersKey(p.prefix), "{not json"); err != nil {
		t.Fatal(err)
	}
	if _, _, _, membersOK, _, err = p.load(ctx, hclog.NewNullLogger()); err != nil || membersOK {
		t.Fatalf("invalid members: ok %v err %v, want not ok and no error", membersOK, err)
	}
	if head.Version != 2 || len(head.ChunkVersions) != head.Chunks || len(got) != len(es) {
		t.Fatalf("head %+v, %d entries read back, want version 2 with every chunk's version and %d entries", head, len(got), len(es))
	}
	for _, en := range got {
		if en.Identity == "key:042" && en.Shares["us-east"] != 0.9 {
			t.Fatalf("the changed entry read back as %v", en.Shares)
		}
	}
	// Deposed: the write fails at etcd, and the next layout writes every chunk.
	if _, err := cli.Delete(ctx, elKey); err != nil {
		t.Fatal(err)
	}
	if err := p.write(ctx, pub(3)); err != ErrFenced {
		t.Fatalf("write after the election key went: %v, want ErrFenced", err)
	}
	if _, err := cli.Put(ctx, elKey, "me again"); err != nil {
		t.Fatal(err)
	}
	r, err := cli.Get(ctx, elKey)
	if err != nil {
		t.Fatal(err)
	}
	p.rev = r.Kvs[0].CreateRevision
	before := chunkWrites()
	if err := p.write(ctx, pub(4)); err != nil {
		t.Fatal(err)
	}
	if n := chunkWrites() - before; n != first {
		t.Fatalf("after a failed write: %v chunk writes, want all %v", n, first)
	}
}
