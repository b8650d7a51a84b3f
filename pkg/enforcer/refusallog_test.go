package enforcer

import (
	"bytes"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/allot-dev/allot/pkg/rules"
	"github.com/hashicorp/go-hclog"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var digestRE = regexp.MustCompile(`identity-digest=([0-9a-f]{16})`)

// refusalDigests has each key refused (rate 1, burst 1, the clock still) on a fresh
// enforcer and returns the digest its last refusal log named, and the log.
func refusalDigests(t *testing.T, key []byte, logIDs bool, keys ...string) ([]string, string) {
	t.Helper()
	var buf syncBuf
	r := newRig(t, "rules:\n  - id: default\n    limits: [{name: second, rate: 1, per: 1s}]\n", nil, func(c *Config) {
		c.RefusalLogEvery, c.IdentityDigestKey, c.LogIdentities = 1, key, logIDs
		c.Logger = hclog.New(&hclog.LoggerOptions{Output: &buf, Level: hclog.Info})
	})
	var out []string
	for _, k := range keys {
		before := len(digestRE.FindAllStringSubmatch(buf.String(), -1))
		r.check(t, rules.Attrs{APIKey: k}) // allowed the first time, refused if seen before
		if d := r.check(t, rules.Attrs{APIKey: k}); d.Allowed {
			t.Fatalf("%s: second check allowed", k)
		}
		m := digestRE.FindAllStringSubmatch(buf.String(), -1)
		if len(m) <= before {
			t.Fatalf("after %s's refusal: no new digest in the log:\n%s", k, buf.String())
		}
		out = append(out, m[len(m)-1][1])
	}
	return out, buf.String()
}

// TestRefusalLogIdentityDigest (issue 28, item 8): the plan-refusal runbook tells one key
// from many by the refusal logs, which named only region, rule, limit and source. Each
// sampled refusal now carries a keyed, non-reversible digest of the identity: the same
// for one key (on every enforcer given the same key), different for another, the key itself
// absent unless log_identities allows it.
func TestRefusalLogIdentityDigest(t *testing.T) {
	secret := []byte("fleet-wide-secret")
	a, log := refusalDigests(t, secret, false, "k_acme_live_1", "k_other", "k_acme_live_1")
	if a[0] != a[2] || a[0] == a[1] {
		t.Fatalf("digests %v: want one per key, the same for the same key", a)
	}
	if strings.Contains(log, "k_acme_live_1") || strings.Contains(log, "k_other") {
		t.Fatalf("the key itself is in the log without log_identities:\n%s", log)
	}
	if !strings.Contains(log, "counted-by=api_key") {
		t.Fatalf("refusal log lacks counted-by:\n%s", log)
	}
	b, _ := refusalDigests(t, secret, false, "k_acme_live_1")
	if b[0] != a[0] {
		t.Fatalf("another enforcer with the same key: digest %s, want %s", b[0], a[0])
	}
	c, _ := refusalDigests(t, []byte("another-secret"), false, "k_acme_live_1")
	if c[0] == a[0] {
		t.Fatal("another secret gave the same digest: it is not keyed")
	}
	_, log = refusalDigests(t, secret, true, "k_acme_live_1")
	if !strings.Contains(log, "identity=key:k_acme_live_1") {
		t.Fatalf("log_identities: the identity is not logged:\n%s", log)
	}
}
