package app

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// The enforcer's TLS helper (pkg/enforcer/app) is unexported; these are the balancer's
// two small ones: client TLS to etcd and server TLS for the report API.

// build returns the client TLS config, or nil when TLS is off.
func (t TLSConfig) build() (*tls.Config, error) {
	if !t.Enabled {
		if t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" {
			return nil, fmt.Errorf("tls files set (ca %q, cert %q, key %q) but tls.enabled is false", t.CAFile, t.CertFile, t.KeyFile)
		}
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
	if t.CAFile != "" {
		pool, err := loadPool(t.CAFile)
		if err != nil {
			return nil, err
		}
		c.RootCAs = pool
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, fmt.Errorf("cert_file %q and key_file %q must be set together", t.CertFile, t.KeyFile)
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("while loading the client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// build returns the server TLS config, or nil when TLS is off.
func (t ServerTLSConfig) build() (*tls.Config, error) {
	if !t.Enabled {
		if t.CertFile != "" || t.KeyFile != "" || t.ClientCAFile != "" {
			return nil, fmt.Errorf("tls files set (cert %q, key %q, client ca %q) but tls.enabled is false", t.CertFile, t.KeyFile, t.ClientCAFile)
		}
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("while loading the server certificate: %w", err)
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if t.ClientCAFile != "" {
		pool, err := loadPool(t.ClientCAFile)
		if err != nil {
			return nil, err
		}
		c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return c, nil
}

func loadPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("while reading a CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA file %q holds no PEM certificate", path)
	}
	return pool, nil
}
