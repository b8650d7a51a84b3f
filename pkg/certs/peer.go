package certs

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// PeerMayReport refuses (PermissionDenied, the message starting with who) a usage report
// for region unless the gRPC connection's verified client certificate names that region
// (RegionOfState): the check the balancer's leader and a region's aggregator make before
// they read a report.
func PeerMayReport(ctx context.Context, who, region string) error {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return status.Errorf(codes.PermissionDenied, "%s: report refused: no peer (reports need mutual TLS)", who)
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return status.Errorf(codes.PermissionDenied, "%s: report for region %q refused: the connection from %v is not TLS (reports need an enforcer client certificate)", who, region, p.Addr)
	}
	got, err := RegionOfState(ti.State)
	if err != nil {
		return status.Errorf(codes.PermissionDenied, "%s: report for region %q refused: %v", who, region, err)
	}
	if got != region {
		return status.Errorf(codes.PermissionDenied, "%s: report for region %q refused: the client certificate is region %q's (%s)", who, region, got, EnforcerURI(got))
	}
	return nil
}
