package grpcapi

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
)

// Codec's RateLimitResponse writer: a response with only the fields ShouldRateLimit sets
// (plainResponse) is appended in proto.Marshal's bytes, fields in number order, each
// embedded message written once with its length filled in after it (beginMessage,
// endMessage).

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
