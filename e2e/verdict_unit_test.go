package e2e

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// TestVerdictCodec: the generator's codec reads the verdict of any well-formed answer
// (the null server's, one of allot's shape, a refusal) and refuses a malformed one; it
// leaves nothing of a previous answer in the message it fills.
func TestVerdictCodec(t *testing.T) {
	refused := cannedResponse()
	refused.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	c := newVerdictCodec()
	for name, m := range map[string]*rlsv3.RateLimitResponse{
		"null":    {OverallCode: rlsv3.RateLimitResponse_OK},
		"shaped":  cannedResponse(),
		"refused": refused,
		"empty":   {},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		got := cannedResponse() // a previous answer's fields must not survive
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, got); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got.OverallCode != m.OverallCode || len(got.Statuses) != 0 || len(got.ResponseHeadersToAdd) != 0 {
			t.Errorf("%s: decoded %v, want only overall_code %v", name, got, m.OverallCode)
		}
	}
	full, _ := proto.Marshal(refused)
	for name, b := range map[string][]byte{
		"cut in a status":   full[:len(full)/2],
		"cut after a tag":   {0x08},
		"bad varint":        {0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		"field number zero": {0x00, 0x01},
	} {
		var got rlsv3.RateLimitResponse
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &got); err == nil {
			t.Errorf("%s: decoded %v, want an error", name, &got)
		}
	}
}

// BenchmarkGeneratorDecode: what the load generator spends reading one answer, the null
// server's or one of allot's shape, decoded whole (ALLOT_BENCH_DECODE=full) or for its
// verdict (the default).
func BenchmarkGeneratorDecode(b *testing.B) {
	answers := []struct {
		name string
		m    *rlsv3.RateLimitResponse
	}{{"null", &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}}, {"allot", cannedResponse()}}
	codecs := []struct {
		name string
		c    encoding.CodecV2
	}{{"full", newVerdictCodec().proto}, {"verdict", newVerdictCodec()}}
	for _, c := range codecs {
		for _, a := range answers {
			wire, err := proto.Marshal(a.m)
			if err != nil {
				b.Fatal(err)
			}
			b.Run(c.name+"/"+a.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					var resp rlsv3.RateLimitResponse // a new message per call, as the generated client makes
					if err := c.c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, &resp); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
