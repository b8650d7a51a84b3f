package enforcer

import (
	"encoding/base64"
	"fmt"
	"strings"

	"github.com/allot-dev/allot/pkg/bucket"
)

// handleKind is one kind of handle a check answers and a later call hands back: the
// in-flight slots a check holds (slotHandle) or the takes a settlement names
// (settleHandle). Its text is prefix + an id + "." + base64url(a NUL b NUL …), at most
// maxHeld pairs (a: a rule's or limit's name, b: the identity). Reading one checks every
// part and wraps ErrInvalid, naming what kind of handle was wrong and how; what the id
// stands for is never believed from the handle (the stores hold it).
type handleKind struct {
	prefix string
	what   string // "handle", "settle handle": for errors
	id     string // what the id is called, for errors
	pairs  string // what the pairs are called, for errors
	maxID  int
}

func (k handleKind) encode(id string, n int, pair func(i int) (a, b string)) string {
	var buf []byte
	for i := range n {
		if i > 0 {
			buf = append(buf, 0)
		}
		a, b := pair(i)
		buf = append(buf, a...)
		buf = append(buf, 0)
		buf = append(buf, b...)
	}
	return k.prefix + id + "." + base64.RawURLEncoding.EncodeToString(buf)
}

func (k handleKind) decode(h string, each func(a, b string)) (id string, err error) {
	bad := func(why string) error { return fmt.Errorf("%w: %s: %s", ErrInvalid, k.what, why) }
	if len(h) > MaxHandleLen {
		return "", bad(fmt.Sprintf("%d bytes, more than %d", len(h), MaxHandleLen))
	}
	rest, ok := strings.CutPrefix(h, k.prefix)
	if !ok {
		return "", bad(fmt.Sprintf("not a %s this enforcer gave (want %s…)", k.what, k.prefix))
	}
	id, enc, ok := strings.Cut(rest, ".")
	if !ok || id == "" || len(id) > k.maxID {
		return "", bad("no " + k.id)
	}
	raw, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		return "", bad(k.pairs + " are not base64url")
	}
	parts := strings.Split(string(raw), "\x00")
	if len(parts)%2 != 0 || len(parts)/2 > maxHeld {
		return "", bad("malformed " + k.pairs)
	}
	for i := 0; i < len(parts); i += 2 {
		if parts[i] == "" || parts[i+1] == "" || len(parts[i+1]) > bucket.MaxIdentityLen {
			return "", bad("an empty name or identity, or one too long, in " + k.pairs)
		}
	}
	for i := 0; i < len(parts); i += 2 {
		each(parts[i], parts[i+1])
	}
	return id, nil
}
