package testenv

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/certs"
)

// Certs writes the report API's certificates (pkg/certs: a CA, the balancer's server
// certificate for 127.0.0.1 and localhost, one client certificate per region) under dir,
// or under a new t.TempDir() when dir is "", and returns where they are. It fails t on error.
func Certs(t testing.TB, dir string, regions ...string) certs.Files {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	if _, err := certs.Generate(dir, certs.Options{Regions: regions, Now: time.Now()}); err != nil {
		t.Fatalf("testenv: Certs: %v", err)
	}
	return certs.Files{Dir: dir}
}

// EnforcerTLS is the client TLS of region's enforcers under f: its certificate, and the
// CA verifying the balancer. It fails t on error.
func EnforcerTLS(t testing.TB, f certs.Files, region string) *tls.Config {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(f.Enforcer(region), f.EnforcerKey(region))
	if err != nil {
		t.Fatalf("testenv: EnforcerTLS %s: %v", region, err)
	}
	pem, err := os.ReadFile(f.CA())
	if err != nil {
		t.Fatalf("testenv: EnforcerTLS: %v", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, Certificates: []tls.Certificate{pair}}
}
