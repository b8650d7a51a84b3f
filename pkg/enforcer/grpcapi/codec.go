package grpcapi

import (
	"sync"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
)

// The Codec: gRPC's protobuf codec with the two messages of an Envoy check done by hand,
// the request parsed by parse.go and the response written by write.go into buffers lent
// by respBufs.

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
