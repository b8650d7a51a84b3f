package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/allot-dev/allot/pkg/certs"
)

// gRPC over mutual TLS, as Envoy Gateway runs envoyproxy/ratelimit (GRPC_SERVER_USE_TLS
// with a client CA, GRPC_CLIENT_TLS_SAN): a client with a certificate of the CA is
// answered, one without is not, nor one whose certificate lacks the SAN asked for.
func TestGRPCServerTLS(t *testing.T) {
	dir := t.TempDir()
	if _, err := certs.Generate(dir, certs.Options{Regions: []string{"us-east"}, Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	f := certs.Files{Dir: dir}
	caPEM, err := os.ReadFile(f.CA())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	client, err := tls.LoadX509KeyPair(f.Enforcer("us-east"), f.EnforcerKey("us-east"))
	if err != nil {
		t.Fatal(err)
	}
	start := func(san string) *App {
		cfg := DefaultConfig()
		cfg.Region, cfg.Rules.File = "us-east", "../../../configs/rules/example.yaml"
		cfg.Listen.GRPC, cfg.Listen.HTTP = "127.0.0.1:0", "127.0.0.1:0"
		// The balancer's certificate names localhost and 127.0.0.1: it serves here.
		cfg.Listen.GRPCTLS = ServerTLSConfig{Enabled: true, CertFile: f.Balancer(), KeyFile: f.BalancerKey(), ClientCAFile: f.CA()}
		cfg.Listen.GRPCClientSAN = san
		a, err := New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- a.Run(context.Background()) }()
		t.Cleanup(func() { a.Close(); <-done })
		return a
	}
	ask := func(a *App, certs ...tls.Certificate) error {
		cc, err := grpc.NewClient(a.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, Certificates: certs})))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{rlsDesc("remote_address", "10.0.0.1")}})
		return err
	}
	a := start("")
	if err := ask(a, client); err != nil {
		t.Fatalf("with a client certificate: %v", err)
	}
	if err := ask(a); err == nil {
		t.Fatal("without a client certificate: answered")
	}
	if err := ask(start("gateway.internal"), client); err == nil {
		t.Fatal("a client certificate without the SAN asked for: answered")
	}
	if _, err := ParseUnchecked(nil, env(map[string]string{"REDIS_URL": "r:1", "GRPC_SERVER_USE_TLS": "false", "GRPC_SERVER_TLS_CERT": "/c"}), nil); err != nil {
		t.Errorf("their TLS files beside GRPC_SERVER_USE_TLS=false (unused there): %v", err)
	}
}
