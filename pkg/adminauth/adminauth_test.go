package adminauth

import (
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseAndCheck(t *testing.T) {
	tk, err := Parse("# ops\nalice: alice-secret-0123456789\n\nbob:bob-secret-0123456789ab")
	if err != nil || tk.Len() != 2 {
		t.Fatalf("%v %d", err, tk.Len())
	}
	if name, err := tk.Check("bob-secret-0123456789ab"); err != nil || name != "bob" {
		t.Fatalf("bob: %q %v", name, err)
	}
	for _, bad := range []string{"", "bob-secret-0123456789a", "alice-secret-0123456789 "} {
		if _, err := tk.Check(bad); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("%q: %v, want ErrUnauthenticated", bad, err)
		}
	}
	var none *Tokens
	if _, err := none.Check("anything-at-all-here"); !errors.Is(err, ErrUnauthenticated) {
		t.Fatal("a nil set must refuse")
	}
}

func TestParseNamesBadEntries(t *testing.T) {
	for text, want := range map[string]string{
		"alice":                                 "entry 1: want name:secret",
		"al ice:0123456789abcdef":               `name "al ice"`,
		"alice:short":                           "secret is 5 bytes, want at least 16",
		"a:0123456789abcdef,a:0123456789abcdeX": `name "a" appears twice`,
	} {
		_, err := Parse(text)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "0123456789abcdef") {
			t.Errorf("%q: %v, want one naming %q and not the secret", text, err, want)
		}
	}
}

func TestLoadFileAndEnv(t *testing.T) {
	f := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(f, []byte("alice:alice-secret-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tk, err := Load(f, "TOK", func(string) string { return "ci:ci-secret-0123456789ab" })
	if err != nil || tk.Len() != 2 {
		t.Fatalf("%v", err)
	}
	if _, err := Load("", "TOK", func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "no tokens") {
		t.Fatalf("empty: %v", err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer ci-secret-0123456789ab")
	if name, err := tk.Authenticate(r); err != nil || name != "ci" {
		t.Fatalf("%q %v", name, err)
	}
}
