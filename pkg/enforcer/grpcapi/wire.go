package grpcapi

import (
	"context"
	"sync"

	"github.com/allot-dev/allot/pkg/enforcer"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The Envoy RLS method as Register serves it: the generated service's name and method, with
// a handler whose request and response are lent by pools for the one call, so a check's
// messages cost no garbage. With Codec, the request is parsed into a pooled graph and the
// response goes back to its pool once Codec has written it; with gRPC's protobuf codec
// (a server built without Codec) the same types work as the plain messages they hold
// (ProtoReflect), and nothing is pooled past the call.
//
// What it relies on: gRPC keeps nothing of a response once the codec has marshalled it,
// unless the server has a stats handler, binary logging (GRPC_BINARY_LOG_FILTER) or
// grpc.EnableTracing, which read the message after it is sent. cmd/enforcer uses none of
// them; a server that does must not use Codec (without it nothing is returned to a pool).

// rlsServiceName and the method are those of rls.proto (the generated descriptor's).
const rlsServiceName = "envoy.service.ratelimit.v3.RateLimitService"

func (s *Server) rlsServiceDesc() *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: rlsServiceName,
		HandlerType: (*rlsv3.RateLimitServiceServer)(nil),
		Methods:     []grpc.MethodDesc{{MethodName: "ShouldRateLimit", Handler: s.handleShouldRateLimit}},
		Metadata:    "envoy/service/ratelimit/v3/rls.proto",
	}
}

// wireRequest is a RateLimitRequest and room for the usual request's descriptors, lent by
// a Server's pool for one call. ours says Codec parsed it (so Codec writes the response
// too); handle is the call's handler for the interceptors, made once per wireRequest.
type wireRequest struct {
	req    rlsv3.RateLimitRequest
	graph  oneDesc
	ours   bool
	bad    error // what Codec found wrong with the message, if anything
	handle grpc.UnaryHandler
}

// ProtoReflect makes a wireRequest the request it holds to gRPC's protobuf codec.
func (w *wireRequest) ProtoReflect() protoreflect.Message { return w.req.ProtoReflect() }

// reset empties w for its next call, keeping its handler.
func (w *wireRequest) reset() {
	w.req, w.graph, w.ours, w.bad = rlsv3.RateLimitRequest{}, oneDesc{}, false, nil
}

func (s *Server) newWireRequest() any {
	w := new(wireRequest)
	w.handle = func(ctx context.Context, req any) (any, error) {
		return s.answer(ctx, req.(*rlsv3.RateLimitRequest), w.ours)
	}
	return w
}

func (s *Server) handleShouldRateLimit(_ any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	w := s.wire.Get().(*wireRequest)
	defer func() { // the handler and the interceptors have returned; the response holds nothing of w
		w.reset()
		s.wire.Put(w)
	}()
	if err := dec(w); err != nil {
		return nil, err
	}
	if w.bad != nil {
		return nil, s.malformed(enforcer.APIEnvoyRLS, w.bad)
	}
	if interceptor == nil {
		return s.answer(ctx, &w.req, w.ours)
	}
	return interceptor(ctx, &w.req, &s.info, w.handle)
}

// answer is ShouldRateLimit for the wire: the pooled reply itself when Codec will write it
// (and return it to its pool), else its message.
func (s *Server) answer(ctx context.Context, req *rlsv3.RateLimitRequest, ours bool) (any, error) {
	r, err := s.shouldRateLimit(ctx, req)
	if err != nil {
		return nil, err
	}
	if ours {
		return r, nil
	}
	return &r.resp, nil
}

// replyPool lends replies to the wire path; a reply Codec has written goes back (release).
var replyPool = sync.Pool{New: func() any { return new(reply) }}

// ProtoReflect makes a reply its response to gRPC's protobuf codec.
func (r *reply) ProtoReflect() protoreflect.Message { return r.resp.ProtoReflect() }

// release returns r to replyPool, emptied so that it keeps nothing alive.
func (r *reply) release() {
	*r = reply{}
	replyPool.Put(r)
}

// malformed answers a request whose message did not parse: the client's fault, so
// InvalidArgument and counted as invalid. gRPC itself would answer Internal (a codec's
// error is Internal, before the handler runs), so Codec does not fail on a malformed
// message given in a wireRequest or a lenient: it says so in the message's err field.
func (s *Server) malformed(api enforcer.API, err error) error {
	s.e.CountInvalid(api)
	return status.Error(codes.InvalidArgument, "malformed request: "+err.Error())
}

// lenient carries a message to Codec, which parses it and puts a parse error in err
// instead of failing the call. To another codec it is just the message.
type lenient struct {
	msg proto.Message
	err error
}

// ProtoReflect makes a lenient its message to gRPC's protobuf codec.
func (l *lenient) ProtoReflect() protoreflect.Message { return l.msg.ProtoReflect() }

// allotServiceDesc is allot.v1.Allot's generated service with each method's malformed
// messages answered by malformed.
func (s *Server) allotServiceDesc() *grpc.ServiceDesc {
	d := allotv1.Allot_ServiceDesc
	d.Methods = append([]grpc.MethodDesc(nil), d.Methods...)
	for i := range d.Methods {
		h := d.Methods[i].Handler
		d.Methods[i].Handler = func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			return h(srv, ctx, func(v any) error {
				m, ok := v.(proto.Message)
				if !ok {
					return dec(v)
				}
				l := &lenient{msg: m}
				if err := dec(l); err != nil {
					return err
				}
				if l.err != nil {
					return s.malformed(enforcer.APIAllot, l.err)
				}
				return nil
			}, ic)
		}
	}
	return &d
}
