package bucket

import (
	"strings"
	"testing"

	"github.com/allot-dev/allot/pkg/testenv"
)

func TestSlotIsTheKeysSlot(t *testing.T) {
	for _, id := range []string{"key:abc", "a{b}c", "{", "}", "{}", "%", "%7B", "}{", "ip:2001:db8::/64", "\x00\xff"} {
		k := string(appendKey(nil, DefaultKeyPrefix, id, "per-second"))
		if got, want := Slot(id), testenv.Slot(k); got != want {
			t.Errorf("Slot(%q) = %d, the slot of %q is %d", id, got, k, want)
		}
	}
}

func TestSlotKeys(t *testing.T) {
	for s := 0; s < numSlots; s++ {
		if got := testenv.Slot(slotKey(s)); got != s {
			t.Fatalf("slotKey(%d) = %q hashes to slot %d", s, slotKey(s), got)
		}
	}
}

// FuzzKey: distinct (identity, name) pairs never share a key, and the key's hash tag is
// exactly the escaped identity.
func FuzzKey(f *testing.F) {
	f.Add("a", "x", "a}:x", "x")
	f.Add("a", "x}:y", "a}:x", "y")
	f.Add("a{b}", "x", "a%7Bb%7D", "x")
	f.Add("%", "", "%25", "")
	f.Fuzz(func(t *testing.T, id1, n1, id2, n2 string) {
		k1 := string(appendKey(nil, DefaultKeyPrefix, id1, n1))
		k2 := string(appendKey(nil, DefaultKeyPrefix, id2, n2))
		if (k1 == k2) != (id1 == id2 && n1 == n2) {
			t.Fatalf("(%q, %q) -> %q and (%q, %q) -> %q", id1, n1, k1, id2, n2, k2)
		}
		if id1 == "" {
			return // invalid identity: never used
		}
		open := strings.IndexByte(k1, '{')
		end := open + 1 + strings.IndexByte(k1[open+1:], '}')
		if tag := k1[open+1 : end]; tag != string(appendEscaped(nil, id1)) || strings.ContainsAny(tag, "{}") {
			t.Fatalf("key %q of %q: hash tag %q", k1, id1, tag)
		}
	})
}

func TestBuildArgs(t *testing.T) {
	c := newRedisCall()
	req := &Request{Identity: "a{b", Want: 3, Min: 2, Limits: []Limit{
		{Name: "s", Rate: 0.1, Burst: 7.5},
		{Name: "m", Rate: 1e9, Burst: 1e12},
	}}
	args := c.build("p:", req)
	var got []string
	for _, a := range args {
		switch v := a.(type) {
		case string:
			got = append(got, v)
		case *string:
			got = append(got, *v)
		}
	}
	want := []string{"evalsha", takeSHA, "2", "p:{a%7Bb}:s", "p:{a%7Bb}:m", "3", "2", "0.1", "7.5", "1e+09", "1e+12"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("args\n got %q\nwant %q", got, want)
	}
	if a := testing.AllocsPerRun(100, func() { c.build("p:", req) }); a > 1 {
		t.Fatalf("build allocates %v times, want at most 1 (the string of the arguments)", a)
	}
}
