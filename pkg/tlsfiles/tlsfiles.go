// Package tlsfiles turns the TLS sections of allot's config files — PEM files named by
// path — into *tls.Config: Client for the connections a process makes (Redis, etcd, the
// balancer's report API), Server for the ones it serves. A section that names files but
// is not enabled is an error, not silently plaintext. TLS 1.2 at least.
package tlsfiles

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// Client is client TLS, as written in a config file. The zero value is TLS off.
type Client struct {
	Enabled bool `yaml:"enabled"`
	// CAFile verifies the server (default: the system's roots).
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile, together, are this client's certificate (mutual TLS).
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName overrides the name verified in the server's certificate.
	ServerName         string `yaml:"server_name"`
	InsecureSkipVerify bool   `yaml:"insecure_skip_verify"`
}

// Build returns the client TLS config, or nil when TLS is off.
func (t Client) Build() (*tls.Config, error) {
	if !t.Enabled {
		if t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" {
			return nil, fmt.Errorf("tls files set (ca %q, cert %q, key %q) but tls.enabled is false", t.CAFile, t.CertFile, t.KeyFile)
		}
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
	if t.CAFile != "" {
		pool, err := pool("ca_file", t.CAFile)
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

// Server is server TLS, as written in a config file. With ClientCAFile set, clients must
// present a certificate that chains to it. The zero value is TLS off.
type Server struct {
	Enabled      bool   `yaml:"enabled"`
	CertFile     string `yaml:"cert_file"`
	KeyFile      string `yaml:"key_file"`
	ClientCAFile string `yaml:"client_ca_file"`
}

// Build returns the server TLS config, or nil when TLS is off.
func (t Server) Build() (*tls.Config, error) {
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
		pool, err := pool("client_ca_file", t.ClientCAFile)
		if err != nil {
			return nil, err
		}
		c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return c, nil
}

func pool(field, path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("while reading %s: %w", field, err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s %q holds no PEM certificate", field, path)
	}
	return p, nil
}
