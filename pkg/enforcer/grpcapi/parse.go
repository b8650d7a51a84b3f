package grpcapi

import (
	"errors"
	"unicode/utf8"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Codec's RateLimitRequest parser: unmarshalRequest reads the message field by field, as
// proto.Unmarshal would, into a parser whose fixed arrays hold the usual request's
// descriptors and entries, then builds the message's descriptors (build): for the usual
// request, one descriptor of at most two entries, in one allocation (none on the wire
// path, which lends the room: wire.go).

// errWire is the request parser's one error: the message is not a well-formed
// RateLimitRequest (the parser stops at the first fault and does not say more, as
// proto.Unmarshal's errors do not help a client either).
var errWire = errors.New("grpcapi: malformed envoy.service.ratelimit.v3.RateLimitRequest")

// sharedStrings is the largest message whose strings are cut from one copy of it: a key kept
// by a table pins the whole copy, so a large message's strings are copied one by one.
const sharedStrings = 256

// The fields of the request that allot reads (the numbers of rls.proto and ratelimit.proto).
const (
	reqDomain, reqDescriptors, reqHits        = 1, 2, 3
	descEntries, descLimit, descHits, descNeg = 1, 2, 3, 4
	entryKey, entryValue                      = 1, 2
)

// unmarshalRequest parses msg into m as proto.Unmarshal would (m is new, as gRPC gives it):
// the last of a scalar field wins, repeated fields append, an embedded message given
// twice is merged, unknown fields are skipped. The descriptor's limit override is kept
// (without its unit_multiplier, which envoyproxy/ratelimit ignores). Each message is one loop over
// its fields (no callbacks: this is the check path).
func unmarshalRequest(msg []byte, m *rlsv3.RateLimitRequest, g *oneDesc) error {
	p := parser{msg: msg}
	if len(msg) <= sharedStrings {
		p.str = string(msg)
	}
	var domain string
	var hits uint32
	for at, end := 0, len(msg); at < end; {
		num, typ, val, err := p.tag(at, end)
		if err != nil {
			return err
		}
		switch {
		case num == reqDomain && typ == protowire.BytesType:
			domain, at, err = p.stringAt(val, end)
		case num == reqDescriptors && typ == protowire.BytesType:
			var from, to int
			if from, to, at, err = p.bytesAt(val, end); err == nil {
				err = p.descriptor(from, to)
			}
		case num == reqHits && typ == protowire.VarintType:
			var v uint64
			v, at, err = p.varintAt(val, end)
			hits = uint32(v)
		default:
			at, err = p.skip(num, typ, val, end)
		}
		if err != nil {
			return err
		}
	}
	m.Domain, m.HitsAddend = domain, hits
	if p.nDesc > 0 {
		m.Descriptors = p.build(g)
	}
	return nil
}

// descriptor parses one RateLimitDescriptor at msg[at:end].
func (p *parser) descriptor(at, end int) error {
	d := parsedDesc{first: p.nEntry}
	for at < end {
		num, typ, val, err := p.tag(at, end)
		if err != nil {
			return err
		}
		var v uint64
		switch {
		case num == descNeg && typ == protowire.VarintType:
			v, at, err = p.varintAt(val, end)
			d.negative = v != 0
		case num == descEntries && typ == protowire.BytesType:
			var from, to int
			if from, to, at, err = p.bytesAt(val, end); err == nil {
				err = p.entry(from, to)
			}
		case num == descLimit && typ == protowire.BytesType: // RateLimitOverride: two varints
			var from, to int
			if from, to, at, err = p.bytesAt(val, end); err == nil {
				d.hasLimit = true
				d.rpu, d.unit, err = p.override(from, to, d.rpu, d.unit)
			}
		case num == descHits && typ == protowire.BytesType: // google.protobuf.UInt64Value
			var from, to int
			if from, to, at, err = p.bytesAt(val, end); err == nil {
				d.hasHits = true
				var last uint64
				var seen bool
				if last, seen, err = p.lastVarint(from, to, 1); seen {
					d.hits = last
				}
			}
		default:
			at, err = p.skip(num, typ, val, end)
		}
		if err != nil {
			return err
		}
	}
	d.n = p.nEntry - d.first
	p.addDesc(d)
	return nil
}

// override reads a RateLimitOverride at msg[at:end] into the values so far (a message
// given twice is merged): requests_per_unit (1) and unit (2), the last of each winning;
// unit_multiplier (3), which envoyproxy/ratelimit ignores, is skipped as unknown.
func (p *parser) override(at, end int, rpu, unit uint64) (uint64, uint64, error) {
	for at < end {
		num, typ, val, err := p.tag(at, end)
		if err != nil {
			return 0, 0, err
		}
		switch {
		case num == 1 && typ == protowire.VarintType:
			rpu, at, err = p.varintAt(val, end)
		case num == 2 && typ == protowire.VarintType:
			unit, at, err = p.varintAt(val, end)
		default:
			at, err = p.skip(num, typ, val, end)
		}
		if err != nil {
			return 0, 0, err
		}
	}
	return rpu, unit, nil
}

// lastVarint returns the last value of varint field f in the message at msg[at:end], and
// whether it was there.
func (p *parser) lastVarint(at, end int, f protowire.Number) (last uint64, seen bool, err error) {
	for at < end {
		num, typ, val, err := p.tag(at, end)
		if err != nil {
			return 0, false, err
		}
		if num == f && typ == protowire.VarintType {
			last, at, err = p.varintAt(val, end)
			seen = true
		} else {
			at, err = p.skip(num, typ, val, end)
		}
		if err != nil {
			return 0, false, err
		}
	}
	return last, seen, nil
}

// entry parses one descriptor entry at msg[at:end].
func (p *parser) entry(at, end int) error {
	var e parsedEntry
	for at < end {
		num, typ, val, err := p.tag(at, end)
		if err != nil {
			return err
		}
		switch {
		case num == entryKey && typ == protowire.BytesType:
			e.key, at, err = p.stringAt(val, end)
		case num == entryValue && typ == protowire.BytesType:
			e.value, at, err = p.stringAt(val, end)
		default:
			at, err = p.skip(num, typ, val, end)
		}
		if err != nil {
			return err
		}
	}
	p.addEntry(e)
	return nil
}

// oneDesc is the graph of the usual request, one descriptor of at most two entries (an
// api key and an address, say), in one allocation.
type oneDesc struct {
	ptr       [1]*ratelimitv3.RateLimitDescriptor
	desc      [1]ratelimitv3.RateLimitDescriptor
	entryPtrs [2]*ratelimitv3.RateLimitDescriptor_Entry
	entries   [2]ratelimitv3.RateLimitDescriptor_Entry
}

// build makes the parsed descriptors into the message's, in g when they fit and g is not
// nil (g is zero: a pooled request is emptied when it is returned).
func (p *parser) build(g *oneDesc) []*ratelimitv3.RateLimitDescriptor {
	var (
		ptrs      []*ratelimitv3.RateLimitDescriptor
		descs     []ratelimitv3.RateLimitDescriptor
		entryPtrs []*ratelimitv3.RateLimitDescriptor_Entry
		entries   []ratelimitv3.RateLimitDescriptor_Entry
	)
	pds, pes := p.parsedDescs(), p.parsedEntries()
	if len(pds) == 1 && len(pes) <= 2 {
		if g == nil {
			g = new(oneDesc)
		}
		ptrs, descs, entryPtrs, entries = g.ptr[:], g.desc[:], g.entryPtrs[:], g.entries[:]
	} else {
		ptrs = make([]*ratelimitv3.RateLimitDescriptor, len(pds))
		descs = make([]ratelimitv3.RateLimitDescriptor, len(pds))
		entryPtrs = make([]*ratelimitv3.RateLimitDescriptor_Entry, len(pes))
		entries = make([]ratelimitv3.RateLimitDescriptor_Entry, len(pes))
	}
	for i, e := range pes {
		entries[i].Key, entries[i].Value = e.key, e.value
		entryPtrs[i] = &entries[i]
	}
	for i, pd := range pds {
		d := &descs[i]
		if pd.n > 0 {
			d.Entries = entryPtrs[pd.first : pd.first+pd.n : pd.first+pd.n]
		}
		if pd.hasHits {
			d.HitsAddend = &wrapperspb.UInt64Value{Value: pd.hits}
		}
		d.IsNegativeHits = pd.negative
		if pd.hasLimit { // rare: its own allocation
			d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: uint32(pd.rpu), Unit: typev3.RateLimitUnit(int32(pd.unit))}
		}
		ptrs[i] = d
	}
	return ptrs[:len(pds):len(pds)]
}

// parsedDesc is one descriptor as parsed: its entries are parsed.entries[first:first+n].
type parsedDesc struct {
	first, n  int
	hits      uint64
	rpu, unit uint64 // the limit override's, when hasLimit
	hasHits   bool
	negative  bool
	hasLimit  bool
}

type parsedEntry struct{ key, value string }

// parser reads one request; strings are cut from str when it is set (a copy of the whole
// message), else copied. The usual request's descriptors and entries fit in its arrays, so
// a parser on the stack parses without allocating; more go to the slices.
type parser struct {
	msg           []byte
	str           string
	nDesc, nEntry int
	descArr       [2]parsedDesc
	entryArr      [6]parsedEntry
	descs         []parsedDesc  // when nDesc > len(descArr): every descriptor
	entries       []parsedEntry // when nEntry > len(entryArr): every entry
}

func (p *parser) addDesc(d parsedDesc) {
	p.descs = push(p.descArr[:], p.descs, p.nDesc, d)
	p.nDesc++
}

func (p *parser) addEntry(e parsedEntry) {
	p.entries = push(p.entryArr[:], p.entries, p.nEntry, e)
	p.nEntry++
}

func (p *parser) parsedDescs() []parsedDesc { return items(p.descArr[:], p.descs, p.nDesc) }

func (p *parser) parsedEntries() []parsedEntry { return items(p.entryArr[:], p.entries, p.nEntry) }

// push adds v as item n of a list kept in fixed while it fits and in more from then on
// (every item, copied over when fixed is full); it returns more.
func push[T any](fixed, more []T, n int, v T) []T {
	switch {
	case n < len(fixed):
		fixed[n] = v
		return more
	case n == len(fixed):
		return append(append(make([]T, 0, 2*n), fixed...), v)
	}
	return append(more, v)
}

// items returns the n items of a list kept by push.
func items[T any](fixed, more []T, n int) []T {
	if n <= len(fixed) {
		return fixed[:n]
	}
	return more
}

func (p *parser) cut(from, to int) string {
	if p.str != "" {
		return p.str[from:to]
	}
	return string(p.msg[from:to])
}

// bytesAt reads the length-delimited field value at msg[at:end]; it returns the value's
// bounds and the offset after it.
func (p *parser) bytesAt(at, end int) (from, to, next int, err error) {
	v, n := protowire.ConsumeBytes(p.msg[at:end])
	if n < 0 {
		return 0, 0, 0, errWire
	}
	next = at + n
	return next - len(v), next, next, nil
}

// stringAt is bytesAt for a string field: proto3 strings must be valid UTF-8.
func (p *parser) stringAt(at, end int) (s string, next int, err error) {
	from, to, next, err := p.bytesAt(at, end)
	if err != nil {
		return "", 0, err
	}
	if !utf8.Valid(p.msg[from:to]) {
		return "", 0, errWire
	}
	return p.cut(from, to), next, nil
}

// tag reads the field tag at msg[at:end]: the field's number and wire type, and where its
// value starts.
func (p *parser) tag(at, end int) (protowire.Number, protowire.Type, int, error) {
	num, typ, n := protowire.ConsumeTag(p.msg[at:end])
	if n < 0 || num > protowire.MaxValidNumber {
		return 0, 0, 0, errWire
	}
	return num, typ, at + n, nil
}

// skip passes over the value at msg[at:end] of a field allot does not read: an unknown
// field, or a known one with another wire type, which proto.Unmarshal also keeps as
// unknown. It returns the offset after the value.
func (p *parser) skip(num protowire.Number, typ protowire.Type, at, end int) (int, error) {
	n := protowire.ConsumeFieldValue(num, typ, p.msg[at:end])
	if n < 0 {
		return 0, errWire
	}
	return at + n, nil
}

func (p *parser) varintAt(at, end int) (uint64, int, error) {
	v, n := protowire.ConsumeVarint(p.msg[at:end])
	if n < 0 {
		return 0, 0, errWire
	}
	return v, at + n, nil
}
