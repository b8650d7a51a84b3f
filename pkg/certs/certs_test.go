package certs

import (
	"crypto/tls"
	"crypto/x509"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"
)

var now = time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)

func load(t *testing.T, cert, key string) tls.Certificate {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	if pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
		t.Fatal(err)
	}
	return pair
}

func TestGenerateChainsAndNamesRegions(t *testing.T) {
	dir := t.TempDir()
	res, err := Generate(dir, Options{Regions: []string{"us-east", "eu-west"}, Hosts: []string{"balancer.internal", "10.0.0.7"}, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Written) != 8 || len(res.Kept) != 0 {
		t.Fatalf("written %v kept %v, want 8 files written", res.Written, res.Kept)
	}
	f := Files{Dir: dir}
	pem, _ := os.ReadFile(f.CA())
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	srv := load(t, f.Balancer(), f.BalancerKey())
	for _, h := range []string{"localhost", "127.0.0.1", "balancer.internal", "10.0.0.7"} {
		if _, err := srv.Leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: h, CurrentTime: now}); err != nil {
			t.Errorf("balancer certificate for %s: %v", h, err)
		}
	}
	if _, err := RegionOf(srv.Leaf); err == nil {
		t.Error("the balancer's certificate names a region")
	}
	for _, r := range []string{"us-east", "eu-west"} {
		c := load(t, f.Enforcer(r), f.EnforcerKey(r))
		if _, err := c.Leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, CurrentTime: now}); err != nil {
			t.Errorf("%s: %v", r, err)
		}
		if got, err := RegionOf(c.Leaf); got != r || err != nil {
			t.Errorf("RegionOf(%s certificate) = %q, %v", r, got, err)
		}
	}
	if st, err := os.Stat(f.EnforcerKey("us-east")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("key mode %v %v, want 0600", st.Mode(), err)
	}
}

// Running again keeps the CA and what exists and adds a new region under the same CA;
// Force replaces everything.
func TestGenerateAgainKeepsTheCA(t *testing.T) {
	dir := t.TempDir()
	if _, err := Generate(dir, Options{Regions: []string{"us-east"}, Now: now}); err != nil {
		t.Fatal(err)
	}
	f := Files{Dir: dir}
	ca1, _ := os.ReadFile(f.CA())
	res, err := Generate(dir, Options{Regions: []string{"us-east", "ap-south"}, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	ca2, _ := os.ReadFile(f.CA())
	if string(ca1) != string(ca2) || len(res.Kept) != 3 || len(res.Written) != 2 {
		t.Fatalf("second run: CA same %v, kept %v, written %v", string(ca1) == string(ca2), res.Kept, res.Written)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca2)
	c := load(t, f.Enforcer("ap-south"), f.EnforcerKey("ap-south"))
	if _, err := c.Leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, CurrentTime: now}); err != nil {
		t.Fatalf("the added region's certificate under the kept CA: %v", err)
	}
	if _, err := Generate(dir, Options{Regions: []string{"us-east"}, Now: now, Force: true}); err != nil {
		t.Fatal(err)
	}
	if ca3, _ := os.ReadFile(f.CA()); string(ca3) == string(ca2) {
		t.Fatal("Force kept the CA")
	}
}

func TestGenerateNamesBadOptions(t *testing.T) {
	for _, tc := range []struct {
		opt  Options
		want string
	}{
		{Options{Now: now}, "no regions"},
		{Options{Regions: []string{"US East"}, Now: now}, `region "US East"`},
		{Options{Regions: []string{"us-east/../x"}, Now: now}, `region "us-east/../x"`},
		{Options{Regions: []string{"us-east"}}, "Now is zero"},
	} {
		if _, err := Generate(t.TempDir(), tc.opt); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error naming %q", tc.opt, err, tc.want)
		}
	}
}

func TestRegionOfRefusesOtherShapes(t *testing.T) {
	u := func(s string) *url.URL { v, _ := url.Parse(s); return v }
	for _, tc := range []struct {
		uris []*url.URL
		want string
	}{
		{nil, "names no region"},
		{[]*url.URL{u("spiffe://other/region/us-east/enforcer")}, "names no region"},
		{[]*url.URL{u("spiffe://allot/region/us-east/balancer")}, "want spiffe://allot/region/<region>/enforcer"},
		{[]*url.URL{u("spiffe://allot/region/us-east/enforcer"), u("spiffe://allot/region/eu-west/enforcer")}, "two regions"},
	} {
		if _, err := RegionOf(&x509.Certificate{URIs: tc.uris}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error naming %q", tc.uris, err, tc.want)
		}
	}
	if _, err := RegionOfState(tls.ConnectionState{}); err == nil {
		t.Error("RegionOfState without a verified chain: no error")
	}
}
