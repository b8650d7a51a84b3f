package balancer

import (
	"context"
	"crypto/tls"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/certs"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/allot-dev/allot/pkg/tlsfiles"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// gate answers a report as Service.Report's first step does: peerMayReport, then accepted.
type gate struct {
	allotv1.UnimplementedBalancerServer
}

func (gate) Report(ctx context.Context, r *allotv1.ReportRequest) (*allotv1.ReportResponse, error) {
	if err := peerMayReport(ctx, r.GetRegion()); err != nil {
		return nil, err
	}
	return &allotv1.ReportResponse{Accepted: true}, nil
}

// serveGate serves gate on 127.0.0.1:0 with tc (nil: plaintext) until the test ends.
func serveGate(t *testing.T, tc *tls.Config) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var opts []grpc.ServerOption
	if tc != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	srv := grpc.NewServer(opts...)
	allotv1.RegisterBalancerServer(srv, gate{})
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return lis.Addr().String()
}

func sendReport(t *testing.T, addr string, creds credentials.TransportCredentials, region string) error {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := allotv1.NewBalancerClient(cc).Report(ctx, &allotv1.ReportRequest{Region: region, EnforcerId: "e1", Seq: 1})
	if err == nil && !resp.GetAccepted() {
		t.Fatalf("answer %v without an error", resp)
	}
	return err
}

// Over real mutual TLS on loopback (issue 27 §1): a report without a client certificate
// is refused, one for eu-west over us-east's certificate is PermissionDenied naming both,
// us-east's own is accepted; a plaintext connection is refused by the check itself.
func TestPeerMayReport(t *testing.T) {
	f := testenv.Certs(t, "", "us-east", "eu-west")
	tc, err := tlsfiles.Server{Enabled: true, CertFile: f.Balancer(), KeyFile: f.BalancerKey(), ClientCAFile: f.CA()}.Build()
	if err != nil {
		t.Fatal(err)
	}
	addr := serveGate(t, tc)
	usEast := testenv.EnforcerTLS(t, f, "us-east")
	if err := sendReport(t, addr, credentials.NewTLS(&tls.Config{RootCAs: usEast.RootCAs}), "us-east"); err == nil {
		t.Error("a report without a client certificate was accepted")
	}
	err = sendReport(t, addr, credentials.NewTLS(usEast), "eu-west")
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `region "eu-west" refused`) ||
		!strings.Contains(err.Error(), certs.EnforcerURI("us-east").String()) {
		t.Errorf("eu-west over us-east's certificate: %v, want PermissionDenied naming both", err)
	}
	if err := sendReport(t, addr, credentials.NewTLS(usEast), "us-east"); err != nil {
		t.Errorf("us-east's own report: %v", err)
	}

	// Server TLS without client certificates: the check refuses what the handshake let in.
	noClientAuth, err := tlsfiles.Server{Enabled: true, CertFile: f.Balancer(), KeyFile: f.BalancerKey()}.Build()
	if err != nil {
		t.Fatal(err)
	}
	if err := sendReport(t, serveGate(t, noClientAuth), credentials.NewTLS(usEast), "us-east"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a server that did not ask for a certificate: %v, want PermissionDenied", err)
	}
	if err := sendReport(t, serveGate(t, nil), insecure.NewCredentials(), "us-east"); status.Code(err) != codes.PermissionDenied ||
		!strings.Contains(err.Error(), "not TLS") {
		t.Errorf("plaintext: %v, want PermissionDenied saying it is not TLS", err)
	}
}
