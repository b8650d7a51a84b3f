// Package certs makes and reads the certificates that authenticate usage reports between
// enforcers and the quota balancer (mutual TLS; docs/design.md, "Who may send reports").
//
// One CA signs a server certificate for the balancer replicas and a client certificate
// per region for that region's enforcers. A region's enforcers are named by a URI SAN,
//
//	spiffe://allot/region/<region>/enforcer
//
// and the balancer takes a report for a region only over a connection whose verified
// client certificate names that region (RegionOf). Keys are ECDSA P-256; only the
// standard library is used.
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Scheme and Trust are the URI SAN's scheme and host: spiffe://allot/....
const (
	Scheme = "spiffe"
	Trust  = "allot"
)

// uriShape is the URI SAN's shape, for error messages.
const uriShape = Scheme + "://" + Trust + "/region/<region>/enforcer"

// regionName is what a region may be called in a certificate (and a config).
var regionName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// EnforcerURI is the identity of region's enforcers: spiffe://allot/region/<region>/enforcer.
func EnforcerURI(region string) *url.URL {
	return &url.URL{Scheme: Scheme, Host: Trust, Path: "/region/" + region + "/enforcer"}
}

// RegionOf returns the region a client certificate names (its one
// spiffe://allot/region/<region>/enforcer URI SAN). The certificate must already be
// verified (tls.RequireAndVerifyClientCert): RegionOf only reads it.
func RegionOf(cert *x509.Certificate) (string, error) {
	if cert == nil {
		return "", errors.New("certs: no client certificate")
	}
	region := ""
	for _, u := range cert.URIs {
		if u.Scheme != Scheme || u.Host != Trust {
			continue
		}
		parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
		if len(parts) != 3 || parts[0] != "region" || parts[2] != "enforcer" || !regionName.MatchString(parts[1]) {
			return "", fmt.Errorf("certs: certificate %q has URI SAN %q, want %s", cert.Subject.CommonName, u, uriShape)
		}
		if region != "" && region != parts[1] {
			return "", fmt.Errorf("certs: certificate %q names two regions, %q and %q", cert.Subject.CommonName, region, parts[1])
		}
		region = parts[1]
	}
	if region == "" {
		return "", fmt.Errorf("certs: certificate %q names no region (no URI SAN %s)", cert.Subject.CommonName, uriShape)
	}
	return region, nil
}

// RegionOfState is RegionOf of a connection's verified leaf certificate.
func RegionOfState(st tls.ConnectionState) (string, error) {
	if len(st.VerifiedChains) == 0 || len(st.VerifiedChains[0]) == 0 {
		return "", errors.New("certs: no verified client certificate")
	}
	return RegionOf(st.VerifiedChains[0][0])
}

// Files names what Generate writes under a directory.
type Files struct{ Dir string }

// CA is the CA certificate (what both sides verify the other against).
func (f Files) CA() string { return filepath.Join(f.Dir, "ca.pem") }

// CAKey is the CA's private key (keep it off the hosts that serve).
func (f Files) CAKey() string { return filepath.Join(f.Dir, "ca-key.pem") }

// Balancer is the balancer replicas' server certificate.
func (f Files) Balancer() string { return filepath.Join(f.Dir, "balancer.pem") }

// BalancerKey is its key.
func (f Files) BalancerKey() string { return filepath.Join(f.Dir, "balancer-key.pem") }

// Enforcer is region's enforcers' client certificate.
func (f Files) Enforcer(region string) string {
	return filepath.Join(f.Dir, "enforcer-"+region+".pem")
}

// EnforcerKey is its key.
func (f Files) EnforcerKey(region string) string {
	return filepath.Join(f.Dir, "enforcer-"+region+"-key.pem")
}

// Options says what Generate makes.
type Options struct {
	// Regions get one enforcer client certificate each. Required.
	Regions []string
	// Hosts are the balancer's names as enforcers dial them (DNS names or IP addresses);
	// localhost, 127.0.0.1 and ::1 are always included.
	Hosts []string
	// Now is the time the certificates are valid from (an hour before it, for clock
	// skew). Required: time is the caller's.
	Now time.Time
	// Validity is how long the leaf certificates last. Default a year; the CA lasts ten.
	Validity time.Duration
	// Force replaces existing files, the CA too. Without it an existing CA (ca.pem and
	// ca-key.pem) is reused and existing leaf certificates are kept, so running Generate
	// again only adds what is missing.
	Force bool
}

// Result says what Generate wrote and what it kept.
type Result struct {
	Written, Kept []string
}

// Generate writes, under dir (made 0700), a CA, the balancer's server certificate and a
// client certificate per region, each with its key (keys 0600). See Options.Force.
func Generate(dir string, opt Options) (Result, error) {
	var res Result
	if len(opt.Regions) == 0 {
		return res, errors.New("certs: no regions: name the regions whose enforcers need certificates")
	}
	for _, r := range opt.Regions {
		if !regionName.MatchString(r) {
			return res, fmt.Errorf("certs: region %q: want lower-case letters, digits, '.', '_' or '-' (at most 63)", r)
		}
	}
	if opt.Now.IsZero() {
		return res, errors.New("certs: Options.Now is zero")
	}
	if opt.Validity == 0 {
		opt.Validity = 365 * 24 * time.Hour
	}
	if opt.Validity < 0 {
		return res, fmt.Errorf("certs: validity %v, must be > 0", opt.Validity)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return res, fmt.Errorf("certs: %w", err)
	}
	f := Files{Dir: dir}
	ca, caKey, kept, err := loadOrMakeCA(f, opt)
	if err != nil {
		return res, err
	}
	if kept {
		res.Kept = append(res.Kept, f.CA())
	} else {
		res.Written = append(res.Written, f.CA(), f.CAKey())
	}
	// A new CA makes every leaf certificate under it new too.
	keep := kept && !opt.Force
	leaf := func(cert, key string, tmpl *x509.Certificate) error {
		if keep && exists(cert) && exists(key) {
			res.Kept = append(res.Kept, cert)
			return nil
		}
		if err := issue(cert, key, tmpl, ca, caKey, opt); err != nil {
			return err
		}
		res.Written = append(res.Written, cert, key)
		return nil
	}
	hosts := append([]string{"localhost", "127.0.0.1", "::1"}, opt.Hosts...)
	srv := &x509.Certificate{Subject: pkix.Name{Organization: []string{"allot"}, CommonName: "allot balancer"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			srv.IPAddresses = append(srv.IPAddresses, ip)
		} else if h != "" {
			srv.DNSNames = append(srv.DNSNames, h)
		}
	}
	if err := leaf(f.Balancer(), f.BalancerKey(), srv); err != nil {
		return res, err
	}
	for _, r := range opt.Regions {
		cl := &x509.Certificate{Subject: pkix.Name{Organization: []string{"allot"}, OrganizationalUnit: []string{r}, CommonName: "allot enforcer " + r},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, URIs: []*url.URL{EnforcerURI(r)}}
		if err := leaf(f.Enforcer(r), f.EnforcerKey(r), cl); err != nil {
			return res, err
		}
	}
	return res, nil
}

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

func loadOrMakeCA(f Files, opt Options) (*x509.Certificate, *ecdsa.PrivateKey, bool, error) {
	if !opt.Force && exists(f.CA()) && exists(f.CAKey()) {
		pair, err := tls.LoadX509KeyPair(f.CA(), f.CAKey())
		if err != nil {
			return nil, nil, false, fmt.Errorf("certs: existing CA %s: %w (remove it, or use -force to replace every file)", f.CA(), err)
		}
		key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
		if !ok {
			return nil, nil, false, fmt.Errorf("certs: existing CA key %s is not ECDSA", f.CAKey())
		}
		ca, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			return nil, nil, false, fmt.Errorf("certs: existing CA %s: %w", f.CA(), err)
		}
		if !ca.IsCA || opt.Now.After(ca.NotAfter) {
			return nil, nil, false, fmt.Errorf("certs: existing CA %s is not a CA or has expired (use -force to replace every file)", f.CA())
		}
		return ca, key, true, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, false, fmt.Errorf("certs: CA key: %w", err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{Organization: []string{"allot"}, CommonName: "allot reports CA"},
		NotBefore: opt.Now.Add(-time.Hour), NotAfter: opt.Now.Add(10 * 365 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, false, fmt.Errorf("certs: CA: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, false, fmt.Errorf("certs: CA: %w", err)
	}
	if err := writePair(f.CA(), f.CAKey(), der, key); err != nil {
		return nil, nil, false, err
	}
	return ca, key, false, nil
}

func issue(certFile, keyFile string, tmpl, ca *x509.Certificate, caKey *ecdsa.PrivateKey, opt Options) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("certs: key for %s: %w", certFile, err)
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore, tmpl.NotAfter = opt.Now.Add(-time.Hour), opt.Now.Add(opt.Validity)
	if tmpl.NotAfter.After(ca.NotAfter) {
		tmpl.NotAfter = ca.NotAfter
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("certs: %s: %w", certFile, err)
	}
	return writePair(certFile, keyFile, der, key)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}

func writePair(certFile, keyFile string, der []byte, key *ecdsa.PrivateKey) error {
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("certs: %s: %w", keyFile, err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	return nil
}
