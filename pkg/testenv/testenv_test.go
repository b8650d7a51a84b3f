package testenv

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestSlot(t *testing.T) {
	// Known answers from redis-server's CLUSTER KEYSLOT and the Redis Cluster spec.
	tests := []struct {
		key  string
		want int
	}{
		{"123456789", 0x31C3}, // the CRC16/XMODEM check value
		{"foo", 12182},
		{"somekey", 11058},
		{"{user1000}.following", Slot("user1000")},
		{"foo{}{bar}", Slot("foo{}{bar}")}, // empty first tag: the whole key
		{"foo{{bar}}zap", Slot("{bar")},
		{"foo{bar}{zap}", Slot("bar")},
	}
	for _, tt := range tests {
		if got := Slot(tt.key); got != tt.want {
			t.Errorf("Slot(%q) = %d, want %d", tt.key, got, tt.want)
		}
	}
	if Slot("foo{}{bar}") == Slot("bar") {
		t.Errorf("Slot(%q) used the second tag; the spec hashes the whole key", "foo{}{bar}")
	}
}

func TestSplitImage(t *testing.T) {
	tests := []struct{ in, repo, tag string }{
		{"allot/base:bookworm-1", "allot/base", "bookworm-1"},
		{"redis", "redis", "latest"},
		{"quay.io/coreos/etcd:v3.5.17", "quay.io/coreos/etcd", "v3.5.17"},
		{"localhost:5000/redis", "localhost:5000/redis", "latest"},
	}
	for _, tt := range tests {
		if repo, tag := splitImage(tt.in); repo != tt.repo || tag != tt.tag {
			t.Errorf("splitImage(%q) = %q, %q; want %q, %q", tt.in, repo, tag, tt.repo, tt.tag)
		}
	}
}

func TestLeftover(t *testing.T) {
	now := time.Now().Unix()
	me := strings.Split(ownerID(), "/")
	future := "9999999999"
	tests := []struct {
		name   string
		labels map[string]string
		want   bool
	}{
		{"mine", map[string]string{labelOwner: ownerID(), labelExpires: future}, false},
		{"expired", map[string]string{labelOwner: ownerID(), labelExpires: "1"}, true},
		{"dead owner", map[string]string{labelOwner: me[0] + "/" + me[1] + "/999999999/1", labelExpires: future}, true},
		{"reused pid", map[string]string{labelOwner: me[0] + "/" + me[1] + "/" + me[2] + "/1", labelExpires: future}, true},
		{"other host", map[string]string{labelOwner: "elsewhere/" + me[1] + "/999999999/1", labelExpires: future}, false},
		{"other pid namespace", map[string]string{labelOwner: me[0] + "/pid:[1]/999999999/1", labelExpires: future}, false},
		{"no labels", map[string]string{}, false},
	}
	for _, tt := range tests {
		if got := leftover(tt.labels, now); got != tt.want {
			t.Errorf("%s: leftover(%v) = %v, want %v", tt.name, tt.labels, got, tt.want)
		}
	}
}

func TestFreePorts(t *testing.T) {
	p, err := freePorts(20)
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := portRange()
	seen := map[int]bool{}
	for _, port := range p {
		if port < lo || port >= hi || seen[port] {
			t.Errorf("freePorts gave %d (range [%d, %d), seen %v)", port, lo, hi, seen[port])
		}
		seen[port] = true
	}
}
