package cliconf

import "github.com/allot-dev/allot/pkg/tlsfiles"

// ClientTLS is the five overrides of a client TLS section, named after prefix: -<prefix>-tls
// (on/off), -<prefix>-tls-ca, -<prefix>-tls-cert, -<prefix>-tls-key and
// -<prefix>-tls-server-name. what names the server in their usage, e.g. "etcd".
// InsecureSkipVerify is left out: a program offers it, for tests, on its own.
func ClientTLS[C any](prefix, what string, get func(*C) *tlsfiles.Client) []Override[C] {
	field := func(f func(*tlsfiles.Client) *string) func(*C) *string {
		return func(c *C) *string { return f(get(c)) }
	}
	return []Override[C]{
		{Name: prefix + "-tls", Usage: "use TLS to " + what, IsBool: true, Apply: Bool(func(c *C) *bool { return &get(c).Enabled })},
		{Name: prefix + "-tls-ca", Usage: "CA file for " + what + " TLS", Apply: Str(field(func(t *tlsfiles.Client) *string { return &t.CAFile }))},
		{Name: prefix + "-tls-cert", Usage: "client certificate for " + what + " TLS", Apply: Str(field(func(t *tlsfiles.Client) *string { return &t.CertFile }))},
		{Name: prefix + "-tls-key", Usage: "client key for " + what + " TLS", Apply: Str(field(func(t *tlsfiles.Client) *string { return &t.KeyFile }))},
		{Name: prefix + "-tls-server-name", Usage: "server name to verify for " + what + " TLS", Apply: Str(field(func(t *tlsfiles.Client) *string { return &t.ServerName }))},
	}
}
