package grpcapi

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/allot-dev/allot/pkg/enforcer/enforcertest"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// requestSeeds are well-formed requests, and the odd shapes proto allows: fields twice,
// out of order, unknown fields, a key given with another wire type, a hits wrapper twice.
func requestSeeds(t testing.TB) [][]byte {
	t.Helper()
	d := desc("generic_key", "g", "api_key", "k")
	d.HitsAddend = wrapperspb.UInt64(1 << 40)
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: 2, UnitMultiplier: wrapperspb.UInt32(30)}
	neg := desc("api_key", "n")
	neg.IsNegativeHits = true
	var out [][]byte
	for _, r := range []*rlsv3.RateLimitRequest{
		{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("api_key", "key-1234", "remote_address", "10.0.0.1")}},
		{Domain: "api", HitsAddend: 7, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("method", "GET", "path", "/x"), desc("ip", "::1"), d, neg}},
		{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "1", "b", "2", "c", "3", "d", "4", "e", "5")}},
		{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{{}}},
		{},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, "first")
	b = protowire.AppendTag(b, 99, protowire.Fixed64Type) // unknown
	b = protowire.AppendFixed64(b, 1)
	b = protowire.AppendTag(b, 1, protowire.VarintType) // domain with another wire type: unknown
	b = protowire.AppendVarint(b, 3)
	var dd []byte
	dd = protowire.AppendTag(dd, 3, protowire.BytesType) // hits wrapper, twice: merged
	dd = protowire.AppendBytes(dd, protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 9))
	dd = protowire.AppendTag(dd, 3, protowire.BytesType)
	dd = protowire.AppendBytes(dd, nil)
	dd = protowire.AppendTag(dd, 1, protowire.BytesType)
	dd = protowire.AppendBytes(dd, []byte{0x0a, 0x01, 'k', 0x12, 0x01, 'v', 0x0a, 0x01, 'K'})
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendBytes(b, dd)
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, "last")
	out = append(out, b, []byte{0x12, 0x00}, []byte{0x0a, 0x02, 0xff, 0xfe}, []byte{0x12, 0x03, 0x0a, 0x01, 0x0a})
	return out
}

// checkRequest holds unmarshalRequest to proto.Unmarshal on b: both fail, or both give the
// same message (unknown fields aside: the codec does not keep them).
func checkRequest(t *testing.T, b []byte) {
	var want rlsv3.RateLimitRequest
	werr := proto.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, &want)
	var got rlsv3.RateLimitRequest
	gerr := unmarshalRequest(b, &got, nil)
	if (werr == nil) != (gerr == nil) {
		t.Fatalf("% x: codec error %v, proto.Unmarshal error %v", b, gerr, werr)
	}
	dropMultipliers(&want)
	if werr == nil && !proto.Equal(&got, &want) {
		t.Fatalf("% x: codec gives %v, proto.Unmarshal %v", b, &got, &want)
	}
}

// dropMultipliers removes the limit overrides' unit_multiplier, which the codec does not
// keep (envoyproxy/ratelimit ignores it).
func dropMultipliers(m *rlsv3.RateLimitRequest) {
	for _, d := range m.Descriptors {
		if d.Limit != nil {
			d.Limit.UnitMultiplier = nil
		}
	}
}

func TestCodecRequest(t *testing.T) {
	for _, b := range requestSeeds(t) {
		checkRequest(t, b)
	}
	// And through the codec's interface, in one buffer and split in two.
	c := Codec()
	for _, b := range requestSeeds(t) {
		for _, data := range []mem.BufferSlice{{mem.SliceBuffer(b)}, {mem.SliceBuffer(b[:len(b)/2]), mem.SliceBuffer(b[len(b)/2:])}} {
			var got, want rlsv3.RateLimitRequest
			gerr, werr := c.Unmarshal(data, &got), proto.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, &want)
			dropMultipliers(&want)
			if (gerr == nil) != (werr == nil) || werr == nil && !proto.Equal(&got, &want) {
				t.Fatalf("% x in %d buffers: codec %v (%v), proto %v (%v)", b, len(data), &got, gerr, &want, werr)
			}
		}
	}
}

// FuzzCodecRequest: for any bytes, the codec's request is proto.Unmarshal's, or both err.
func FuzzCodecRequest(f *testing.F) {
	for _, b := range requestSeeds(f) {
		f.Add(b)
	}
	f.Fuzz(checkRequest)
}

// checkResponse holds appendResponse to proto.Marshal on m, byte for byte.
func checkResponse(t *testing.T, m *rlsv3.RateLimitResponse) {
	t.Helper()
	if !plainResponse(m) {
		t.Fatalf("%v: not plain", m)
	}
	want, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	got := appendResponse(nil, m)
	if !bytes.Equal(got, want) {
		t.Fatalf("%v:\ncodec % x\nproto % x", m, got, want)
	}
}

func TestCodecResponse(t *testing.T) {
	rig := enforcertest.New(t, testRules)
	s := New(rig.E, Config{})
	ctx := context.Background()
	for i := range 5 { // allowed, then refused: every field the handler sets
		for _, d := range [][]*ratelimitv3.RateLimitDescriptor{
			{desc("api_key", "k1")},
			{desc("remote_address", "10.0.0.1")},
			{desc("api_key", "k2"), desc("ip", "::1"), desc("x", "y")},
		} {
			resp, err := s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: d})
			if err != nil {
				t.Fatal(i, err)
			}
			checkResponse(t, resp)
		}
	}
	checkResponse(t, &rlsv3.RateLimitResponse{})
	checkResponse(t, &rlsv3.RateLimitResponse{OverallCode: -1, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
		Code: 2, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{}, DurationUntilReset: &durationpb.Duration{Seconds: -3, Nanos: -5},
	}}, ResponseHeadersToAdd: []*corev3.HeaderValue{{}, {RawValue: []byte{0}}}})

	// Through the codec's interface: a response in a pooled buffer, and one too large for
	// them in its own, each proto.Marshal's bytes.
	for _, m := range []*rlsv3.RateLimitResponse{
		{OverallCode: rlsv3.RateLimitResponse_OK, ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "k", Value: "v"}}},
		{OverallCode: rlsv3.RateLimitResponse_OK, ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "k", Value: strings.Repeat("v", 3*respBufSize)}}},
	} {
		for range 3 { // a buffer back from the pool is written over whole
			data, err := Codec().Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := proto.Marshal(m)
			if got := data.Materialize(); !bytes.Equal(got, want) {
				t.Fatalf("%d bytes through the codec differ from proto.Marshal's %d", len(got), len(want))
			}
			data.Free()
		}
	}

	// What the codec does not write goes to gRPC's protobuf codec.
	for _, m := range []*rlsv3.RateLimitResponse{
		{RawBody: []byte("x")},
		{Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{UnitMultiplier: wrapperspb.UInt32(2)}}}},
		{RequestHeadersToAdd: []*corev3.HeaderValue{{Key: "a"}}},
	} {
		if plainResponse(m) {
			t.Fatalf("%v: plain", m)
		}
		data, err := Codec().Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := proto.Marshal(m)
		if got := data.Materialize(); !bytes.Equal(got, want) {
			t.Fatalf("%v: % x, want % x", m, got, want)
		}
		data.Free()
	}
	// Other messages pass through.
	data, err := Codec().Marshal(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
	if err != nil {
		t.Fatal(err)
	}
	var h healthpb.HealthCheckResponse
	if err := Codec().Unmarshal(data, &h); err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health through the codec: %v %v", &h, err)
	}
	data.Free()
}

// FuzzCodecResponse: for responses of any field values, the codec writes proto.Marshal's
// bytes.
func FuzzCodecResponse(f *testing.F) {
	f.Add(int32(1), int32(2), "default/second", uint32(500), int32(1), uint32(3), int64(1), int32(0), "RateLimit", "\"d\";r=3;t=1", uint8(2))
	f.Add(int32(0), int32(-7), "", uint32(0), int32(0), uint32(0), int64(-1), int32(-1), "", "", uint8(0))
	f.Fuzz(func(t *testing.T, overall, code int32, name string, rpu uint32, unit int32, remaining uint32, secs int64, nanos int32, hk, hv string, n uint8) {
		m := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_Code(overall)}
		for i := range int(n % 4) {
			st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_Code(code), LimitRemaining: remaining}
			if i%2 == 0 {
				st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: rpu, Unit: rlsv3.RateLimitResponse_RateLimit_Unit(unit)}
				st.DurationUntilReset = &durationpb.Duration{Seconds: secs, Nanos: nanos}
			}
			m.Statuses = append(m.Statuses, st)
			m.ResponseHeadersToAdd = append(m.ResponseHeadersToAdd, &corev3.HeaderValue{Key: hk, Value: hv})
		}
		if !utf8.ValidString(name) || !utf8.ValidString(hk) || !utf8.ValidString(hv) {
			return // proto.Marshal refuses invalid UTF-8; the handler never writes it
		}
		checkResponse(t, m)
	})
}

// BenchmarkCodec is the wire work of one check, the load benchmark's request (one
// descriptor: a key and an address) and the handler's allowed answer, by the codec and by
// gRPC's protobuf codec.
func BenchmarkCodec(b *testing.B) {
	rig := enforcertest.New(b, testRules)
	s := New(rig.E, Config{})
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		desc("api_key", "key-1234", "remote_address", "10.0.0.1"),
	}}
	resp, err := s.ShouldRateLimit(context.Background(), req)
	if err != nil {
		b.Fatal(err)
	}
	wire, _ := proto.Marshal(req)
	for _, c := range []struct {
		name  string
		codec interface {
			Marshal(any) (mem.BufferSlice, error)
			Unmarshal(mem.BufferSlice, any) error
		}
	}{{"allot", Codec()}, {"proto", Codec().(codec).proto}} {
		b.Run(c.name+"/request", func(b *testing.B) {
			b.ReportAllocs()
			data := mem.BufferSlice{mem.SliceBuffer(wire)}
			for b.Loop() {
				var r rlsv3.RateLimitRequest
				if err := c.codec.Unmarshal(data, &r); err != nil {
					b.Fatal(err)
				}
			}
		})
		if c.name == "allot" { // as the wire path parses: into a pooled request (wire.go)
			b.Run(c.name+"/request-pooled", func(b *testing.B) {
				b.ReportAllocs()
				data := mem.BufferSlice{mem.SliceBuffer(wire)}
				for b.Loop() {
					w := s.wire.Get().(*wireRequest)
					if err := c.codec.Unmarshal(data, w); err != nil {
						b.Fatal(err)
					}
					w.reset()
					s.wire.Put(w)
				}
			})
		}
		b.Run(c.name+"/response", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				out, err := c.codec.Marshal(resp)
				if err != nil {
					b.Fatal(err)
				}
				out.Free()
			}
		})
	}
}
