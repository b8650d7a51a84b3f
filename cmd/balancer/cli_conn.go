package main

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/allot-dev/allot/pkg/balancer/admin"
)

// The connection flags: how every command but "rules check" reaches the admin API (-addr,
// the token from -token-file or -token-env, -ca-file, -timeout), and the client they make.

// common holds the connection flags, which every command but "rules check" takes.
type common struct {
	addr, tokenFile, tokenName, tokenEnv, caFile string
	timeout                                      time.Duration
}

func (c *common) register(fs *flag.FlagSet, getenv func(string) string) {
	def := getenv("ALLOT_ADMIN_ADDR")
	if def == "" {
		def = "127.0.0.1:9091"
	}
	fs.StringVar(&c.addr, "addr", def, "balancer HTTP address (http://host:port or https://...)")
	fs.StringVar(&c.tokenFile, "token-file", "", "file holding the admin token: the secret alone, or name:secret lines (the balancer's tokens file)")
	fs.StringVar(&c.tokenName, "token-name", "", "with -token-file of name:secret lines: which token to use")
	fs.StringVar(&c.tokenEnv, "token-env", "ALLOT_ADMIN_TOKEN", "environment variable holding the admin token")
	fs.StringVar(&c.caFile, "ca-file", "", "CA certificate of the balancer's TLS certificate")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "bound of the whole command")
}

func (c *common) client(getenv func(string) string) (*admin.Client, error) {
	tok := ""
	if c.tokenFile != "" {
		b, err := os.ReadFile(c.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("while reading the token file: %w", err)
		}
		if tok, err = secretFrom(string(b), c.tokenFile, c.tokenName); err != nil {
			return nil, err
		}
	} else if c.tokenEnv != "" {
		tok = strings.TrimSpace(getenv(c.tokenEnv))
	}
	if tok == "" {
		return nil, fmt.Errorf("no admin token: set -token-file or $%s", c.tokenEnv)
	}
	hc := &http.Client{Timeout: c.timeout}
	if c.caFile != "" {
		pem, err := os.ReadFile(c.caFile)
		if err != nil {
			return nil, fmt.Errorf("while reading the CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %q holds no PEM certificate", c.caFile)
		}
		hc.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	}
	return &admin.Client{Base: c.addr, Token: tok, HTTP: hc}, nil
}

// secretFrom reads the secret in a -token-file: the secret alone on one line, or
// name:secret lines (the balancer's admin.tokens_file, '#' comments and blank lines
// skipped), of which name picks one (needed when there are several). A line without ':'
// is a secret alone. The secret never appears in an error.
func secretFrom(text, file, name string) (string, error) {
	type entry struct{ name, secret string }
	var entries []entry
	for line := range strings.SplitSeq(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		n, sec, ok := strings.Cut(line, ":")
		if !ok {
			n, sec = "", line
		}
		entries = append(entries, entry{strings.TrimSpace(n), strings.TrimSpace(sec)})
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.name)
		if name != "" && e.name == name {
			return e.secret, nil
		}
	}
	switch {
	case len(entries) == 0:
		return "", fmt.Errorf("token file %s holds no token", file)
	case name != "":
		return "", fmt.Errorf("token file %s has no token named %q (it has: %s)", file, name, strings.Join(names, ", "))
	case len(entries) > 1:
		return "", fmt.Errorf("token file %s holds %d tokens (%s): pick one with -token-name", file, len(entries), strings.Join(names, ", "))
	}
	return entries[0].secret, nil
}
