package dashboard

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/allot-dev/allot/pkg/adminauth"
)

// Who sees what. Identities (API keys, client addresses) are customers' secrets: a viewer
// sees them only with a token of Config.Viewers (the balancer's admin tokens, or
// read-only dashboard tokens), presented as "Authorization: Bearer <token>", as
// "?token=<token>" (answered with a cookie and a redirect to the same page without it, so
// the token leaves the address bar) or as that cookie. Without a token every identity is
// masked: its kind and a keyed hash, "key:3fa94c0b1d2e…", stable while this process runs
// and the same for every viewer, so a masked identity can still be followed from page to
// page. A token that is not one of Viewers is 401 (and the cookie is cleared): a viewer
// who meant to see identities is told, not shown a masked page as if nothing were wrong.
// Config.ShowIdentities shows them to everyone (the demo on loopback).

// TokenCookie is the cookie a ?token= sign-in sets.
const TokenCookie = "allot_dashboard_token"

// maskHexLen is the hex digits of a masked identity: 48 bits, no collision in practice
// among the at most Samples × Top identities the history holds.
const maskHexLen = 12

// viewer is who asks: whether identities are shown, and the token's name if any.
type viewer struct {
	show bool
	name string
}

// errBadToken is a token that is not one of the viewers'.
var errBadToken = errors.New("dashboard: the token is not one of the dashboard's or the admin API's tokens")

// viewerOf authenticates r. redirect is set when r carried ?token=: the URL to send the
// viewer to (the same without the token), after setting the cookie.
func (d *Dashboard) viewerOf(r *http.Request) (v viewer, token, redirect string, err error) {
	v.show = d.cfg.ShowIdentities
	tok, ok, err := adminauth.Bearer(r)
	if err != nil {
		return v, "", "", err
	}
	if !ok {
		if q := r.URL.Query(); q.Has("token") {
			tok, ok = q.Get("token"), true
			q.Del("token")
			u := *r.URL
			u.RawQuery = q.Encode()
			redirect = u.RequestURI()
		} else if c, cerr := r.Cookie(TokenCookie); cerr == nil && c.Value != "" {
			if t, uerr := url.QueryUnescape(c.Value); uerr == nil {
				tok, ok = t, true
			}
		}
	}
	if !ok {
		return v, "", "", nil
	}
	for _, ts := range d.cfg.Viewers {
		if name, err := ts.Check(tok); err == nil {
			return viewer{show: true, name: name}, tok, redirect, nil
		}
	}
	return v, "", "", errBadToken
}

// setTokenCookie keeps a ?token= sign-in for the dashboard's pages only.
func (d *Dashboard) setTokenCookie(w http.ResponseWriter, r *http.Request, token string) {
	http.SetCookie(w, &http.Cookie{Name: TokenCookie, Value: url.QueryEscape(token), Path: d.cfg.Prefix + "/",
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
}

func (d *Dashboard) clearTokenCookie(w http.ResponseWriter) {
	http.SetCookie(w, &http.Cookie{Name: TokenCookie, Value: "", Path: d.cfg.Prefix + "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode})
}

// newMaskKey is a random key for the identities' hashes.
func newMaskKey() []byte {
	k := make([]byte, 32)
	rand.Read(k) // never fails (crypto/rand)
	return k
}

// mask is identity as a viewer without a token sees it: its kind ("key", "ip", ...: the
// part before the first ':' when it is a short word) and a keyed hash of the whole.
func (d *Dashboard) mask(identity string) string {
	m := hmac.New(sha256.New, d.cfg.MaskKey)
	m.Write([]byte(identity))
	h := hex.EncodeToString(m.Sum(nil))[:maskHexLen]
	kind := "id"
	if k, _, ok := strings.Cut(identity, ":"); ok && isKind(k) {
		kind = k
	}
	return kind + ":" + h + "…"
}

func isKind(s string) bool {
	if s == "" || len(s) > 16 {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// shown is identity as v sees it.
func (d *Dashboard) shown(v viewer, identity string) string {
	if v.show {
		return identity
	}
	return d.mask(identity)
}

// unmask finds the identity of the history whose mask is masked ("" if none).
func (d *Dashboard) unmask(ss []sample, masked string) string {
	for i := len(ss) - 1; i >= 0; i-- {
		for _, x := range ss[i].ids {
			if d.mask(x.k.identity) == masked {
				return x.k.identity
			}
		}
	}
	return ""
}

func unauthorized(w http.ResponseWriter, err error) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="allot dashboard"`)
	w.Header().Set("Cache-Control", "no-store")
	http.Error(w, fmt.Sprintf("%v; open the dashboard without a token to see it with identities masked", err), http.StatusUnauthorized)
}
