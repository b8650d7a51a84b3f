package grpcapi

import (
	"errors"
	"sync"
	"unicode/utf8"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Codec returns the enforcer's gRPC codec (give it to grpc.ForceServerCodecV2). It is
// gRPC's protobuf codec with the two messages of every Envoy check written by hand with
// protowire: a RateLimitRequest is parsed into the message in two allocations (all its
// strings share one), and a RateLimitResponse as the handler builds it is written without
// reflection. Every other message, and a response with a field the handler never sets, goes
// to gRPC's protobuf codec.
//
// It is a faster codec, not a different one: the request parsed is the message
// proto.Unmarshal gives (errors where it errs, the same fields where it does not, less the
// descriptors' limit override, which allot ignores, and unknown fields), and the
// bytes written are proto.Marshal's, byte for byte (FuzzCodecRequest and FuzzCodecResponse
// hold it to both). Measured with BenchmarkCodec on a 2-core machine: the load
// benchmark's request in 350–380 ns and 3 allocations (one fewer on the wire path, which
// lends the descriptors' room: wire.go) against 540–580 ns and 12, the allowed answer in
// 160–162 ns against 517–580 ns.
func Codec() encoding.CodecV2 { return codec{encoding.GetCodecV2("proto")} }

type codec struct{ proto encoding.CodecV2 }

func (codec) Name() string { return "proto" }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*reply); ok { // the wire path's pooled reply: written, then returned
		data, err := c.Marshal(&r.resp)
		r.release()
		return data, err
	}
	m, ok := v.(*rlsv3.RateLimitResponse)
	if !ok || !plainResponse(m) {
		return c.proto.Marshal(v)
	}
	buf := respBufs.Get(0)
	if *buf = appendResponse(*buf, m); cap(*buf) != respBufSize { // outgrew the pooled buffer
		return mem.BufferSlice{mem.SliceBuffer(*buf)}, nil
	}
	return mem.BufferSlice{mem.NewBuffer(buf, respBufs)}, nil
}

// respBufs lends the buffers responses are written into; gRPC puts each back once it is
// written. Their capacity is above gRPC's pooling threshold (mem.NewBuffer pools nothing
// of 1 KiB or less), a response is written whole over what a buffer held (so no zeroing, which
// gRPC's default pool does on every Get), and a response that outgrows one is sent in the
// slice append grew it into.
var respBufs = &bufPool{pool: sync.Pool{New: func() any { b := make([]byte, 0, respBufSize); return &b }}}

const respBufSize = 2048

type bufPool struct{ pool sync.Pool }

// Get implements mem.BufferPool for lengths up to respBufSize.
func (p *bufPool) Get(length int) *[]byte {
	b := p.pool.Get().(*[]byte)
	*b = (*b)[:length]
	return b
}

// Put implements mem.BufferPool.
func (p *bufPool) Put(b *[]byte) {
	if cap(*b) == respBufSize {
		p.pool.Put(b)
	}
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	var m *rlsv3.RateLimitRequest
	var g *oneDesc // room for the descriptors, if the message has some
	var bad *error // where a malformed message is reported instead of failing (wire.go)
	switch v := v.(type) {
	case *wireRequest: // the wire path's pooled request (wire.go)
		m, g, v.ours, bad = &v.req, &v.graph, true, &v.bad
	case *rlsv3.RateLimitRequest:
		m = v
	case *lenient:
		if r, ok := v.msg.(*rlsv3.RateLimitRequest); ok {
			m, bad = r, &v.err
			break
		}
		v.err = c.proto.Unmarshal(data, v.msg)
		return nil
	default:
		return c.proto.Unmarshal(data, v)
	}
	var err error
	if len(data) == 1 { // the usual case: one buffer, read in place
		err = unmarshalRequest(data[0].ReadOnlyData(), m, g)
	} else {
		buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
		err = unmarshalRequest(buf.ReadOnlyData(), m, g)
		buf.Free()
	}
	if err != nil && bad != nil {
		*bad, err = err, nil
	}
	return err
}

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

// parsedDesc is one descriptor as parsed: its entries are parsed.entries[first:first+n].
type parsedDesc struct {
	first, n int
	hits     uint64
	hasHits  bool
	negative bool
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

// unmarshalRequest parses msg into m as proto.Unmarshal would (m is new, as gRPC gives it):
// the last of a scalar field wins, repeated fields append, an embedded message given
// twice is merged, unknown fields are skipped. The descriptor's limit override, which allot
// ignores, is parsed only to be as strict as proto.Unmarshal. Each message is one loop over
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
				err = p.varints(from, to, 1, 2)
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

// varints checks a message at msg[at:end] whose known fields, a and b, are varints.
func (p *parser) varints(at, end int, a, b protowire.Number) error {
	for at < end {
		num, typ, val, err := p.tag(at, end)
		if err != nil {
			return err
		}
		if (num == a || num == b) && typ == protowire.VarintType {
			_, at, err = p.varintAt(val, end)
		} else {
			at, err = p.skip(num, typ, val, end)
		}
		if err != nil {
			return err
		}
	}
	return nil
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
		ptrs[i] = d
	}
	return ptrs[:len(pds):len(pds)]
}

// plainResponse reports whether m has only the fields ShouldRateLimit sets, so
// appendResponse writes all of it.
func plainResponse(m *rlsv3.RateLimitResponse) bool {
	if len(m.RequestHeadersToAdd) != 0 || len(m.RawBody) != 0 || m.DynamicMetadata != nil || m.Quota != nil {
		return false
	}
	for _, st := range m.Statuses {
		if st == nil || st.Quota != nil || st.CurrentLimit != nil && st.CurrentLimit.UnitMultiplier != nil {
			return false
		}
	}
	for _, h := range m.ResponseHeadersToAdd {
		if h == nil {
			return false
		}
	}
	return true
}

// The response's field numbers (rls.proto; core/v3/base.proto for HeaderValue; duration.proto).
const (
	respCode, respStatuses, respHeaders   = 1, 2, 3
	stCode, stLimit, stRemaining, stReset = 1, 2, 3, 4
	limRPU, limUnit, limName              = 1, 2, 3
	hdrKey, hdrValue, hdrRawValue         = 1, 2, 3
	durSeconds, durNanos                  = 1, 2
)

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

func appendStringField(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
}

// beginMessage appends the tag of embedded message field num and one byte for its length;
// endMessage, given the offset beginMessage returned, writes the length once the message
// is written, moving it right in the rare case the length needs more than one byte. Each
// message is written once, and no size is computed apart.
func beginMessage(b []byte, num protowire.Number) ([]byte, int) {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return append(b, 0), len(b)
}

func endMessage(b []byte, at int) []byte {
	n := len(b) - at - 1
	if n < 0x80 {
		b[at] = byte(n)
		return b
	}
	k := protowire.SizeVarint(uint64(n))
	b = append(b, make([]byte, k-1)...)
	copy(b[at+k:], b[at+1:at+1+n])
	protowire.AppendVarint(b[at:at], uint64(n))
	return b
}

// enum and int32 values are varints of their sign-extended 64 bits, as in proto.Marshal.
func i32(v int32) uint64 { return uint64(int64(v)) }

// appendResponse appends m's wire form, fields in number order as proto.Marshal writes
// them; m must be plainResponse.
func appendResponse(b []byte, m *rlsv3.RateLimitResponse) []byte {
	b = appendVarintField(b, respCode, i32(int32(m.OverallCode)))
	var st0, lim, rst, hdr int
	for _, st := range m.Statuses {
		b, st0 = beginMessage(b, respStatuses)
		b = appendVarintField(b, stCode, i32(int32(st.Code)))
		if l := st.CurrentLimit; l != nil {
			b, lim = beginMessage(b, stLimit)
			b = appendVarintField(b, limRPU, uint64(l.RequestsPerUnit))
			b = appendVarintField(b, limUnit, i32(int32(l.Unit)))
			b = appendStringField(b, limName, l.Name)
			b = endMessage(b, lim)
		}
		b = appendVarintField(b, stRemaining, uint64(st.LimitRemaining))
		if r := st.DurationUntilReset; r != nil {
			b, rst = beginMessage(b, stReset)
			b = appendVarintField(b, durSeconds, uint64(r.Seconds))
			b = appendVarintField(b, durNanos, i32(r.Nanos))
			b = endMessage(b, rst)
		}
		b = endMessage(b, st0)
	}
	for _, h := range m.ResponseHeadersToAdd {
		b, hdr = beginMessage(b, respHeaders)
		b = appendStringField(b, hdrKey, h.Key)
		b = appendStringField(b, hdrValue, h.Value)
		if len(h.RawValue) > 0 {
			b = protowire.AppendBytes(protowire.AppendTag(b, hdrRawValue, protowire.BytesType), h.RawValue)
		}
		b = endMessage(b, hdr)
	}
	return b
}
