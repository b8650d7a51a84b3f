package report

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"

	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/allot-dev/allot/pkg/testenv/poll"
)

// selfSigned is a CA certificate for 127.0.0.1 usable as server and client certificate.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "allot-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// The Reporter speaks TLS with a client certificate to a leader that requires one; without
// the certificate the report is refused and dropped.
func TestReporterTLS(t *testing.T) {
	cert, pool := selfSigned(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lead := &fakeBalancer{addr: lis.Addr().String(), leader: true}
	lead.srv = grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})))
	allotv1.RegisterBalancerServer(lead.srv, lead)
	done := make(chan struct{})
	go func() { defer close(done); _ = lead.srv.Serve(lis) }()
	t.Cleanup(func() { lead.srv.Stop(); <-done })

	g := newRig(t, StaticLeader(lead.addr), func(c *ReporterConfig) {
		c.TLS = &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	})
	g.tick(t, 10*time.Second)
	poll.True(t, 10*time.Second, "a report over TLS", func() bool { return len(lead.reports()) == 1 })

	bad := newRig(t, StaticLeader(lead.addr), func(c *ReporterConfig) {
		c.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		c.SendTimeout = time.Second
	})
	bad.tick(t, 10*time.Second)
	poll.True(t, 10*time.Second, "the drop without a client certificate", func() bool {
		return counter(t, bad, "allot_usage_reports_dropped_total") == 1
	})
	if n := len(lead.reports()); n != 1 {
		t.Fatalf("the leader took %d reports, want only the authenticated one", n)
	}
}
