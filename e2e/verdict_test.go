package e2e

import (
	"fmt"
	"os"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// decodeEnv set to "full" makes the load generator decode every answer into a whole
// RateLimitResponse, as it did before (see verdictCodec).
const decodeEnv = "ALLOT_BENCH_DECODE"

// verdictCodec is the load generator's codec: requests marshalled by gRPC's own proto
// codec, answers read for their verdict only. The benchmark reads nothing of an answer
// but overall_code; decoding the rest into Go objects cost the generator CPU in
// proportion to the answer's size (~6 µs a check more for allot's answer than for the
// null server's two bytes, and its garbage), on the two cores it shares with the server
// under test. A gateway does that on its own machine; here it was billed to allot's
// latency. verdictCodec walks every field of the answer (a malformed one is still an
// error) and keeps only the verdict, so the generator's cost is the same whatever the
// server sends. ALLOT_BENCH_DECODE=full restores the whole decode.
type verdictCodec struct{ proto encoding.CodecV2 }

func newVerdictCodec() verdictCodec { return verdictCodec{encoding.GetCodecV2("proto")} }

// Name is "proto", so the content-subtype on the wire is unchanged.
func (c verdictCodec) Name() string { return c.proto.Name() }

func (c verdictCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

func (c verdictCodec) Unmarshal(data mem.BufferSlice, v any) error {
	resp, ok := v.(*rlsv3.RateLimitResponse)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	code, err := readVerdict(buf.ReadOnlyData())
	if err != nil {
		return err
	}
	resp.Reset()
	resp.OverallCode = code
	return nil
}

// readVerdict returns the overall_code (field 1) of an encoded RateLimitResponse, checking
// that every field is well formed.
func readVerdict(b []byte) (rlsv3.RateLimitResponse_Code, error) {
	var code rlsv3.RateLimitResponse_Code
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, fmt.Errorf("verdict: bad tag: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, fmt.Errorf("verdict: bad overall_code: %w", protowire.ParseError(n))
			}
			code, b = rlsv3.RateLimitResponse_Code(int32(v)), b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, fmt.Errorf("verdict: bad field %d: %w", num, protowire.ParseError(n))
		}
		b = b[n:]
	}
	return code, nil
}

// generatorDialOptions are the load generator's connection options: its codec, unless
// ALLOT_BENCH_DECODE=full.
func generatorDialOptions() []grpc.DialOption {
	if os.Getenv(decodeEnv) == "full" {
		return nil
	}
	return []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.ForceCodecV2(newVerdictCodec()))}
}
