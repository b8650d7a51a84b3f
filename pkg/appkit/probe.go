package appkit

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// ErrNoHTTP is Probe's error for a process configured without an HTTP listener.
var ErrNoHTTP = errors.New("appkit: probe: no HTTP listener configured (listen.http is empty)")

// Probe asks a server process, from its own host, whether it is ready: GET path (e.g.
// "/readyz") on listen, the HTTP address the process was configured with ("host:port";
// an empty or unspecified host — ":8080", "0.0.0.0:8080", "[::]:8080" — is asked on
// loopback). With useTLS it speaks HTTPS and does not verify the certificate: the probe
// checks that this host's process answers, not who it is (a listener that wants a client
// certificate cannot be probed). On 200 it returns the first line of the answer ("ready",
// "ready, degraded: …"); otherwise an error naming the URL and the status with that line,
// or why no answer came. ctx bounds
// the whole exchange. It is what the image's HEALTHCHECK runs (`enforcer probe`), since
// the image has no curl.
func Probe(ctx context.Context, listen, path string, useTLS bool) (string, error) {
	if listen == "" {
		return "", ErrNoHTTP
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("appkit: probe: listen address %q: %w", listen, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	scheme := "http"
	tr := &http.Transport{Proxy: nil, DisableKeepAlives: true}
	if useTLS {
		scheme = "https"
		tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // a health probe of this host's own listener
	}
	defer tr.CloseIdleConnections()
	url := scheme + "://" + net.JoinHostPort(host, port) + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", fmt.Errorf("appkit: probe: %w", err)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return "", fmt.Errorf("appkit: probe: %w", err)
	}
	defer resp.Body.Close()
	line, _ := bufio.NewReader(io.LimitReader(resp.Body, 512)).ReadString('\n')
	line = strings.TrimSpace(line)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("appkit: probe: %s: %s: %s", url, resp.Status, line)
	}
	return line, nil
}

// ProbeTimeout bounds a probe command; Docker's HEALTHCHECK gives it 3 s
// (scripts/images.sh).
const ProbeTimeout = 2 * time.Second

// ProbeCommand is `<name> probe` once the binary has read its settings (help, version and
// bad flags are the binary's): Probe of "/readyz" on listen within ProbeTimeout. Exit 0
// when ready (the answer on stdout), 1 when not or unreachable (why on stderr, after
// "<name> probe:").
func ProbeCommand(name, listen string, useTLS bool, stdout, stderr io.Writer) int {
	ctx, cancel := context.WithTimeout(context.Background(), ProbeTimeout)
	defer cancel()
	answer, err := Probe(ctx, listen, "/readyz", useTLS)
	if err != nil {
		fmt.Fprintf(stderr, "%s probe: %v\n", name, err)
		return 1
	}
	fmt.Fprintln(stdout, answer)
	return 0
}
