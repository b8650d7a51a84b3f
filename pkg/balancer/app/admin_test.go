package app

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/balancer/admin"
	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/hashicorp/go-hclog"
)

func TestAdminConfigNamesBadValues(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-admin", "-rules-etcd-prefix", ""}, "admin.enabled needs rules.etcd_prefix"},
		{[]string{"-admin", "-http-addr", ""}, "admin.enabled needs listen.http"},
	} {
		_, err := Parse(append([]string{"-config", configFile}, tc.args...), env(nil), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want one naming %q", tc.args, err, tc.want)
		}
	}
}

// TestAdminOverTLS: with admin.tls the HTTP listener speaks only TLS, and the admin API
// answers a client that trusts the certificate and shows a token.
func TestAdminOverTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("needs an etcd container")
	}
	e := testenv.Etcd(t, 1)
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("ci:ci-secret-0123456789ab\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse(append([]string{"-config", configFile, "-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0",
		"-etcd-endpoints", strings.Join(e.Endpoints(), ","), "-rules-file", "", "-admin", "-admin-tokens-file", tokens}, tlsArgs(testenv.Certs(t, "", "us-east"))...), env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Admin.TLS = ServerTLSConfig{Enabled: true, CertFile: certFile, KeyFile: keyFile}
	a, err := New(cfg, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	cl := &admin.Client{Base: "https://" + a.HTTPAddr(), Token: "ci-secret-0123456789ab", HTTP: hc}
	if _, err := cl.Rules(context.Background()); err != nil {
		t.Fatalf("over TLS: %v", err)
	}
	plain := &admin.Client{Base: "http://" + a.HTTPAddr(), Token: "ci-secret-0123456789ab", HTTP: &http.Client{Timeout: 5 * time.Second}}
	if _, err := plain.Rules(context.Background()); err == nil {
		t.Fatal("plain HTTP answered on a TLS listener")
	}
}

func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "balancer"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(c)
	return certFile, keyFile, pool
}

// TestAdminOffSaysWhatToTurnOn (issue 28, item 3): with the admin API off (the default),
// every /v1/admin/ path answers 404 with an error naming admin.enabled, -admin and the
// tokens, which the CLI prints, rather than "404 page not found". No etcd is needed: New
// does not dial.
func TestAdminOffSaysWhatToTurnOn(t *testing.T) {
	cfg, err := Parse(append([]string{"-config", configFile, "-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0",
		"-etcd-endpoints", "http://127.0.0.1:1", "-rules-file", rulesFile, "-rules-etcd-prefix", ""}, tlsArgs(testenv.Certs(t, "", "us-east"))...), env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(cfg, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	srv := httptest.NewServer(a.mux)
	defer srv.Close()
	for _, path := range []string{"/v1/admin/rules", "/v1/admin/check", "/v1/admin/explain"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		var er admin.ErrorResponse
		err = json.NewDecoder(resp.Body).Decode(&er)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || err != nil || er.Error != AdminOff {
			t.Fatalf("%s: %d %+v (%v), want 404 with %q", path, resp.StatusCode, er, err, AdminOff)
		}
	}
	for _, want := range []string{"admin.enabled: true", "-admin", "admin.tokens_file"} {
		if !strings.Contains(AdminOff, want) {
			t.Errorf("AdminOff lacks %q", want)
		}
	}
}
