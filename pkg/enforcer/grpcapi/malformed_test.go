package grpcapi

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/allot-dev/allot/pkg/enforcer/enforcertest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// rawCodec sends a message's bytes as given, so a test can put any bytes on the wire.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }

func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}

// malformedMessages are the wire faults of issue 27, as bytes.
func malformedMessages() map[string][]byte {
	deep := append(bytes.Repeat([]byte{0x2b}, 20000), bytes.Repeat([]byte{0x2c}, 20000)...) // field 5 groups
	return map[string][]byte{
		"invalid UTF-8 in a string": {0x0a, 0x02, 0xff, 0xfe},
		"truncated varint":          {0x18, 0xff},
		"truncated length":          {0x0a, 0x05, 'a'},
		"field number 0":            {0x00, 0x01},
		"unmatched end-group":       {0x0c},
		"20,000 nested groups":      deep,
		"garbage":                   []byte("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"),
	}
}

// TestMalformedProtobufInvalidArgument: a message that does not parse is the client's
// fault — InvalidArgument, counted as invalid — on both services (gRPC says Internal).
func TestMalformedProtobufInvalidArgument(t *testing.T) {
	rig := enforcertest.New(t, testRules)
	cc := serve(t, New(rig.E, Config{Domain: "api"}))
	ctx := context.Background()
	n := 0
	for _, method := range []string{"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", "/allot.v1.Allot/Check"} {
		for name, msg := range malformedMessages() {
			var out []byte
			err := cc.Invoke(ctx, method, &msg, &out, grpc.ForceCodec(rawCodec{}))
			n++
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "malformed request") {
				t.Errorf("%s, %s: %v, want InvalidArgument: malformed request", method, name, err)
			}
		}
	}
	mfs, err := rig.Reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var counted float64
	for _, mf := range mfs {
		if mf.GetName() == "allot_enforcer_invalid_requests_total" {
			for _, m := range mf.GetMetric() {
				counted += m.GetCounter().GetValue()
			}
		}
	}
	if int(counted) != n {
		t.Errorf("counted %v invalid requests, want %d", counted, n)
	}
}
