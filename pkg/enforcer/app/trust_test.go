package app

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestForwardAuthTrustConfig (issue 27 §3): forward_auth.trusted_proxies and
// trusted_headers reach httpapi; absent, the defaults (loopback; the README snippets'
// headers); [] trusts no peer; bad entries are refused by name.
func TestForwardAuthTrustConfig(t *testing.T) {
	load := func(t *testing.T, auth string) (Config, error) {
		t.Helper()
		p := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(p, []byte("region: r\nrules: {file: rules.yaml}\nforward_auth:\n"+auth), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := command.LoadFile(p)
		if err != nil {
			return c, err
		}
		return c, c.Validate()
	}
	c, err := load(t, "  trusted_hops: 1\n")
	if err != nil {
		t.Fatal(err)
	}
	if ac := c.authConfig(); ac.TrustedProxies != nil || ac.TrustedHeaders != nil {
		t.Errorf("absent: proxies %v headers %v, want nil (httpapi's defaults)", ac.TrustedProxies, ac.TrustedHeaders)
	}
	c, err = load(t, "  trusted_proxies: [10.0.0.0/8, 192.0.2.7]\n  trusted_headers: [X-Forwarded-For, X-Plan]\n")
	if err != nil {
		t.Fatal(err)
	}
	ac := c.authConfig()
	if want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32")}; !slices.Equal(ac.TrustedProxies, want) {
		t.Errorf("trusted proxies %v, want %v", ac.TrustedProxies, want)
	}
	if want := []string{"X-Forwarded-For", "X-Plan"}; !slices.Equal(ac.TrustedHeaders, want) {
		t.Errorf("trusted headers %v, want %v", ac.TrustedHeaders, want)
	}
	c, err = load(t, "  trusted_proxies: []\n")
	if err != nil {
		t.Fatal(err)
	}
	if ac := c.authConfig(); ac.TrustedProxies == nil || len(ac.TrustedProxies) != 0 {
		t.Errorf("trusted_proxies: [] gave %#v, want an empty non-nil list (no peer trusted)", ac.TrustedProxies)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"  trusted_proxies: [10.0.0.0/40]\n", `forward_auth: httpapi: trusted proxies[0]: "10.0.0.0/40"`},
		{"  trusted_headers: [X-Api-Key]\n", "forward_auth: httpapi: trusted headers: X-Api-Key is the API key"},
		{"  trusted_headers: [X-Tenant]\n", `"X-Tenant" is not a header forward auth reads`},
	} {
		if _, err := load(t, tc.yaml); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error containing %q", tc.yaml, err, tc.want)
		}
	}
}
