package dashboard

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/adminauth"
)

const (
	opsSecret  = "ops-secret-0123456789"
	viewSecret = "view-secret-0123456789"
)

// masked is a dashboard as deployed: identities only for the admin token "ops" and the
// read-only dashboard token "noc".
func masked(t *testing.T) *Dashboard {
	t.Helper()
	admin, err := adminauth.Parse("ops:" + opsSecret)
	if err != nil {
		t.Fatal(err)
	}
	view, err := adminauth.Parse("noc:" + viewSecret)
	if err != nil {
		t.Fatal(err)
	}
	d, _, _ := run(t, 10*time.Minute, func(c *Config) {
		c.ShowIdentities, c.Viewers, c.MaskKey = false, []*adminauth.Tokens{admin, view}, []byte("test mask key")
	})
	return d
}

func do(t *testing.T, d http.Handler, path string, edit func(*http.Request)) (*http.Response, string) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	if edit != nil {
		edit(req)
	}
	rec := httptest.NewRecorder()
	d.ServeHTTP(rec, req)
	return rec.Result(), rec.Body.String()
}

// customers' identities in the fixture, as the pages would show them unmasked
var secrets = []string{"k_acme", "k_globex", "k_initech", "pwned"}

func mustNotContain(t *testing.T, page string, what ...string) {
	t.Helper()
	for _, w := range what {
		if strings.Contains(page, w) {
			t.Errorf("page shows %q", w)
		}
	}
}

// TestDashboardMasksWithoutToken (issue 27 §4): the dashboard needed no token and showed
// customers' API keys. Without a token every identity is masked, the page says so, and a
// masked identity can still be followed to its page; a raw key finds nothing.
func TestDashboardMasksWithoutToken(t *testing.T) {
	d := masked(t)
	res, page := do(t, d, "/dashboard/", nil)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("no token: %d, want 200 (masked)", res.StatusCode)
	}
	mustNotContain(t, page, secrets...)
	acme := d.mask("key:k_acme")
	if !strings.HasPrefix(acme, "key:") || len(acme) != len("key:")+maskHexLen+len("…") {
		t.Fatalf("mask of key:k_acme is %q, want key:<%d hex>…", acme, maskHexLen)
	}
	href := "/dashboard/identity?" + url.Values{"identity": {acme}, "rule": {"pro"}}.Encode()
	mustContain(t, page, `id="masked"`, "Identities are masked", acme, strings.ReplaceAll(href, "&", "&amp;"))
	if d.mask("key:k_acme") != acme || d.mask("key:k_globex") == acme {
		t.Error("masks are not stable per identity")
	}
	// The masked identity's own page: its figures, not its name.
	_, page = do(t, d, href, nil)
	mustContain(t, page, acme, "rule <b>pro</b>", "global limit <b>500/s</b>", `id="share"`)
	mustNotContain(t, page, secrets...)
	// A raw key is not looked up for a viewer without a token.
	_, page = do(t, d, "/dashboard/identity?identity=key:k_acme&rule=pro", nil)
	mustNotContain(t, page, "global limit <b>500/s</b>", `id="share"`)
}

// TestDashboardTokenShowsIdentities: the admin token or a read-only dashboard token, as a
// bearer header, a ?token= (kept in a cookie, the address bar cleared) or the cookie,
// shows identities.
func TestDashboardTokenShowsIdentities(t *testing.T) {
	d := masked(t)
	for _, tc := range []struct{ name, secret, viewer string }{{"admin", opsSecret, "ops"}, {"dashboard", viewSecret, "noc"}} {
		t.Run(tc.name, func(t *testing.T) {
			res, page := do(t, d, "/dashboard/", func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+tc.secret) })
			if res.StatusCode != http.StatusOK {
				t.Fatalf("bearer: %d", res.StatusCode)
			}
			mustContain(t, page, "key:k_acme", `id="viewer"`, "<b>"+tc.viewer+"</b>")
			mustNotContain(t, page, `id="masked"`)

			res, _ = do(t, d, "/dashboard/identity?identity=key%3Ak_acme&rule=pro&token="+url.QueryEscape(tc.secret), nil)
			if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/dashboard/identity?identity=key%3Ak_acme&rule=pro" {
				t.Fatalf("?token=: %d to %q, want 303 to the same page without the token", res.StatusCode, res.Header.Get("Location"))
			}
			var cookie *http.Cookie
			for _, c := range res.Cookies() {
				if c.Name == TokenCookie {
					cookie = c
				}
			}
			if cookie == nil || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode || cookie.Path != "/dashboard/" {
				t.Fatalf("?token= cookie %+v, want HttpOnly, SameSite=Strict, Path=/dashboard/", cookie)
			}
			res, page = do(t, d, res.Header.Get("Location"), func(r *http.Request) { r.AddCookie(cookie) })
			if res.StatusCode != http.StatusOK {
				t.Fatalf("with the cookie: %d", res.StatusCode)
			}
			mustContain(t, page, `<h1 id="identity">key:k_acme</h1>`, "global limit <b>500/s</b>")
		})
	}
}

// TestDashboardBadToken: a token that is not one of them is 401 saying so (and clears
// the cookie), never the page, masked or not: whoever sent it meant to see identities.
func TestDashboardBadToken(t *testing.T) {
	d := masked(t)
	for name, edit := range map[string]func(*http.Request){
		"bearer":    func(r *http.Request) { r.Header.Set("Authorization", "Bearer not-a-token-of-ours-123") },
		"malformed": func(r *http.Request) { r.Header.Set("Authorization", "Basic b3BzOnNlY3JldA==") },
		"query":     func(r *http.Request) { r.URL.RawQuery = "token=not-a-token-of-ours-123" },
		"cookie":    func(r *http.Request) { r.AddCookie(&http.Cookie{Name: TokenCookie, Value: "stale-token-0123456789"}) },
	} {
		res, body := do(t, d, "/dashboard/", edit)
		if res.StatusCode != http.StatusUnauthorized || res.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: %d, want 401 with WWW-Authenticate", name, res.StatusCode)
		}
		if !strings.Contains(body, "without a token") {
			t.Errorf("%s: body %q does not say what to do", name, body)
		}
		mustNotContain(t, body, secrets...)
		cleared := false
		for _, c := range res.Cookies() {
			cleared = cleared || (c.Name == TokenCookie && c.MaxAge < 0)
		}
		if !cleared {
			t.Errorf("%s: the cookie is not cleared", name)
		}
	}
}
