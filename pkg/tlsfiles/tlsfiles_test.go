package tlsfiles

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeCert(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "allot-test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	return certFile, keyFile
}

func TestClient(t *testing.T) {
	dir := t.TempDir()
	cert, key := writeCert(t, dir)
	notPEM := filepath.Join(dir, "not.pem")
	os.WriteFile(notPEM, []byte("hello"), 0o600)
	if c, err := (Client{}).Build(); c != nil || err != nil {
		t.Fatalf("disabled: %v %v, want nil nil", c, err)
	}
	c, err := Client{Enabled: true, CAFile: cert, CertFile: cert, KeyFile: key, ServerName: "redis.internal"}.Build()
	if err != nil || c.RootCAs == nil || len(c.Certificates) != 1 || c.ServerName != "redis.internal" {
		t.Fatalf("full: %+v %v", c, err)
	}
	for _, tc := range []struct {
		cfg  Client
		want string
	}{
		{Client{CAFile: cert}, "tls.enabled is false"},
		{Client{Enabled: true, CAFile: notPEM}, "holds no PEM certificate"},
		{Client{Enabled: true, CAFile: filepath.Join(dir, "missing")}, "while reading ca_file"},
		{Client{Enabled: true, CertFile: cert}, "must be set together"},
		{Client{Enabled: true, CertFile: notPEM, KeyFile: key}, "while loading the client certificate"},
	} {
		if _, err := tc.cfg.Build(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
}
