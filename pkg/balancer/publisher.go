package balancer

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/allot-dev/allot/pkg/contract"
	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// publisher writes one term's share sets to etcd. Every transaction is fenced on the
// term's election key: If(CreateRevision(key) == rev), so once the key is gone (lease
// expired, resigned) or belongs to a newer campaign, etcd refuses the write (ErrFenced).
//
// A changed version is written as the chunks whose entries changed (contract.Chunker:
// one Txn each, each ≤ maxBytes: within etcd's request limit), then one Txn deleting the
// chunk keys past the new count, then the head, which lists each chunk's version. Writes
// per version are thus the changed chunks + 2, at most ⌈listed entries × ~150 B /
// (maxBytes/2)⌉ + 2 whatever the key count, and Core.MaxPublished bounds the listed
// entries. A head refresh is one Txn. A failed write makes the next version write every
// chunk (what is in etcd is then not known).
type publisher struct {
	cli      *clientv3.Client
	prefix   string
	key      string
	rev      int64
	maxBytes int
	timeout  time.Duration
	m        *metrics
	chunks   int      // chunk keys that may exist in etcd: [0, chunks)
	versions []uint64 // each chunk's version, for the head
	layout   *contract.Chunker
}

func (p *publisher) txn(ctx context.Context, kind string, ops ...clientv3.Op) error {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	resp, err := p.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(p.key), "=", p.rev)).Then(ops...).Commit()
	switch {
	case err != nil:
		p.m.writes.WithLabelValues(kind, "error").Inc()
		return fmt.Errorf("while writing %s: %w", kind, err)
	case !resp.Succeeded:
		p.m.writes.WithLabelValues(kind, "fenced").Inc()
		return ErrFenced
	}
	p.m.writes.WithLabelValues(kind, "ok").Inc()
	return nil
}

// write publishes pub (changed chunks then head when Changed; the head alone otherwise).
func (p *publisher) write(ctx context.Context, pub *Publication) (err error) {
	if p.layout == nil {
		p.layout = contract.NewChunker(p.maxBytes)
	}
	defer func() {
		if err != nil {
			p.layout.Reset()
		}
	}()
	head := pub.Head
	if pub.Members != nil {
		// Before the set: a version may count on these enforcers' acknowledgements, and a
		// leader that restores it must know them (members.go).
		b, err := json.Marshal(pub.Members)
		if err != nil {
			return fmt.Errorf("while encoding the members: %w", err)
		}
		if err := p.txn(ctx, "members", clientv3.OpPut(contract.MembersKey(p.prefix), string(b))); err != nil {
			return err
		}
		p.m.writeBytes.WithLabelValues("members").Add(float64(len(b)))
	}
	if pub.Changed {
		writes, versions := p.layout.Next(pub.Entries, head.LeaderRev, head.Version)
		for _, w := range writes {
			if err := p.txn(ctx, "chunk", clientv3.OpPut(contract.ChunkKey(p.prefix, w.Index), string(w.Data))); err != nil {
				return err
			}
			p.m.writeBytes.WithLabelValues("chunk").Add(float64(len(w.Data)))
		}
		// Stale chunks past the new count: readers ignore them (Head.Chunks), delete them so
		// etcd does not keep them. At most 64 deletes a Txn (etcd's default max-txn-ops 128).
		for lo := len(versions); lo < p.chunks; lo += 64 {
			var ops []clientv3.Op
			for i := lo; i < min(lo+64, p.chunks); i++ {
				ops = append(ops, clientv3.OpDelete(contract.ChunkKey(p.prefix, i)))
			}
			if err := p.txn(ctx, "delete", ops...); err != nil {
				return err
			}
		}
		p.chunks, p.versions = len(versions), versions
	}
	// Every chunk at the head's version: no list (a reader that predates it reads the set).
	head.ChunkVersions = nil
	for _, v := range p.versions {
		if v != head.Version {
			head.ChunkVersions = p.versions
			break
		}
	}
	head.Chunks = p.chunks
	b, err := json.Marshal(head)
	if err != nil {
		return fmt.Errorf("while encoding the head: %w", err)
	}
	if err := p.txn(ctx, "head", clientv3.OpPut(contract.HeadKey(p.prefix), string(b))); err != nil {
		return err
	}
	p.m.writeBytes.WithLabelValues("head").Add(float64(len(b)))
	return nil
}

// load reads the persisted set: the head and every chunk under the prefix, and the
// members (contract.Members) the last term counted; membersOK is false when they are
// absent or invalid (Core.RestoreMembers then assumes the most). Chunks are
// written before their head, so a leader that died between the two leaves chunks newer
// than the head: load takes every chunk key, and for an identity in two chunks the entry
// of the newer (rev, version). Each entry is a set the plan published, so each sums to ≤ 1
// and the new leader's first version replaces them all anyway. found is false when no
// head exists (a first start).
func (p *publisher) load(ctx context.Context, log hclog.Logger) (head contract.Head, entries []contract.Entry, members contract.Members, membersOK, found bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	resp, err := p.cli.Get(ctx, p.prefix, clientv3.WithPrefix())
	if err != nil {
		return head, nil, members, false, false, err
	}
	type src struct {
		rev int64
		ver uint64
		e   contract.Entry
	}
	best := map[key]src{}
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		if k == contract.HeadKey(p.prefix) {
			if head, err = contract.DecodeHead(kv.Value); err != nil {
				log.Warn("persisted head is invalid; starting from the default split", "error", err)
				head = contract.Head{}
				continue
			}
			found = true
			continue
		}
		if k == contract.MembersKey(p.prefix) {
			if members, err = contract.DecodeMembers(kv.Value); err != nil {
				log.Warn("persisted members are invalid; every region is held as if an enforcer were cut off", "error", err)
				members, err = contract.Members{}, nil
				continue
			}
			membersOK = true
			continue
		}
		i, ok := contract.ChunkIndex(p.prefix, k)
		if !ok {
			continue
		}
		p.chunks = max(p.chunks, i+1)
		c, err := contract.DecodeChunk(kv.Value)
		if err != nil {
			log.Warn("persisted chunk is invalid; its entries are dropped", "key", k, "error", err)
			continue
		}
		for _, e := range c.Entries {
			kk := key{e.Rule, e.Identity}
			if b, ok := best[kk]; !ok || cmp.Or(cmp.Compare(c.LeaderRev, b.rev), cmp.Compare(c.Version, b.ver)) > 0 {
				best[kk] = src{c.LeaderRev, c.Version, e}
			}
		}
	}
	for _, b := range best {
		entries = append(entries, b.e)
	}
	return head, entries, members, membersOK, found, nil
}
