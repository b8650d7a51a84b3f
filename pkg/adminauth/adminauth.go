// Package adminauth checks the bearer tokens of allot's operator APIs (the balancer's
// admin API, the enforcers' /v1/explain): named tokens, so an audit record can say who made
// a change, compared in constant time.
//
// Tokens come from a file or an environment variable, one "name:secret" per line (or
// comma-separated in the variable); blank lines and lines starting with '#' are skipped.
// A name is 1-64 of A-Z a-z 0-9 . _ - and a secret at least MinSecretLen bytes, without
// ',' or a line break (it may hold ':'); surrounding spaces are trimmed.
//
// Authenticate compares the presented secret against every token's, always all of them,
// through SHA-256 digests (equal lengths), so neither the time taken nor an early exit
// says which token, or how much of one, matched.
package adminauth

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
)

// MinSecretLen is the shortest secret accepted: a short secret is guessable.
const MinSecretLen = 16

// ErrUnauthenticated is wrapped by every refusal of Authenticate: the request carried no
// token, a malformed Authorization header, or a token that is not one of the set. Answer
// it with 401.
var ErrUnauthenticated = errors.New("adminauth: unauthenticated")

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

type token struct {
	name   string
	digest [sha256.Size]byte
}

// Tokens is an immutable set of named tokens. The zero value (and nil) holds none and
// refuses every request. Safe for concurrent use.
type Tokens struct {
	list []token
}

// Parse reads tokens from text ("name:secret" a line or comma-separated). Errors name the
// line (never the secret).
func Parse(text string) (*Tokens, error) {
	t := &Tokens{}
	seen := map[string]bool{}
	lines := strings.FieldsFunc(text, func(r rune) bool { return r == '\n' || r == ',' })
	for i, line := range lines {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, secret, ok := strings.Cut(line, ":")
		name, secret = strings.TrimSpace(name), strings.TrimSpace(secret)
		switch {
		case !ok:
			return nil, fmt.Errorf("adminauth: entry %d: want name:secret", i+1)
		case !nameRE.MatchString(name):
			return nil, fmt.Errorf("adminauth: entry %d: name %.70q: want 1-64 of A-Z a-z 0-9 . _ -", i+1, name)
		case len(secret) < MinSecretLen:
			return nil, fmt.Errorf("adminauth: entry %d (%s): secret is %d bytes, want at least %d", i+1, name, len(secret), MinSecretLen)
		case seen[name]:
			return nil, fmt.Errorf("adminauth: entry %d: name %q appears twice", i+1, name)
		}
		seen[name] = true
		t.list = append(t.list, token{name: name, digest: sha256.Sum256([]byte(secret))})
	}
	return t, nil
}

// Load reads tokens from file (if set) and from the environment variable env (if set and
// present), both; it is an error when neither yields a token, so an operator API is never
// served open by mistake.
func Load(file, env string, getenv func(string) string) (*Tokens, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	var text strings.Builder
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("adminauth: while reading the token file: %w", err)
		}
		text.Write(b)
		text.WriteByte('\n')
	}
	if env != "" {
		text.WriteString(getenv(env))
	}
	t, err := Parse(text.String())
	if err != nil {
		return nil, err
	}
	if t.Len() == 0 {
		return nil, fmt.Errorf("adminauth: no tokens (file %q, environment variable %q)", file, env)
	}
	return t, nil
}

// Len is the number of tokens.
func (t *Tokens) Len() int {
	if t == nil {
		return 0
	}
	return len(t.list)
}

// Check returns the name of the token whose secret is secret, or ErrUnauthenticated.
func (t *Tokens) Check(secret string) (string, error) {
	if secret == "" {
		return "", fmt.Errorf("%w: no token", ErrUnauthenticated)
	}
	d := sha256.Sum256([]byte(secret))
	found := -1
	if t != nil {
		for i := range t.list {
			if subtle.ConstantTimeCompare(d[:], t.list[i].digest[:]) == 1 {
				found = i // no break: every token is compared
			}
		}
	}
	if found < 0 {
		return "", fmt.Errorf("%w: the token is not one of the configured admin tokens", ErrUnauthenticated)
	}
	return t.list[found].name, nil
}

// Bearer returns the token of an "Authorization: Bearer <token>" header; ok is false when
// the header is absent, and err is set when it is present but malformed.
func Bearer(r *http.Request) (tok string, ok bool, err error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return "", false, nil
	}
	scheme, rest, _ := strings.Cut(h, " ")
	if !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(rest) == "" {
		return "", true, fmt.Errorf("%w: Authorization header is not \"Bearer <token>\"", ErrUnauthenticated)
	}
	return strings.TrimSpace(rest), true, nil
}

// Authenticate returns the name of the token r carries (Authorization: Bearer), or an
// error wrapping ErrUnauthenticated that says what was wrong.
func (t *Tokens) Authenticate(r *http.Request) (string, error) {
	tok, ok, err := Bearer(r)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", fmt.Errorf("%w: no Authorization: Bearer header", ErrUnauthenticated)
	}
	return t.Check(tok)
}
