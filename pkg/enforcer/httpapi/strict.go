package httpapi

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf8"
)

// checkKeys are CheckRequest's JSON keys, exactly as they must be written.
var checkKeys = [...]string{"api_key", "plan", "org", "endpoint", "ip", "hits"}

// strictBody refuses what encoding/json would quietly accept in a check body and so let
// two different requests share one bucket, or one request be read two ways: a body that
// is not valid UTF-8 (json maps bad bytes to U+FFFD), a lone UTF-16 surrogate in an
// escape (mapped to U+FFFD too), `null`, a key given twice (json keeps the last), a known
// key in another case (json matches keys case-insensitively: "API_KEY") or spelled with
// escapes. It scans the body once, without allocating; the error says what was wrong and
// where. Trailing data is left to the decoder.
func strictBody(b []byte) error {
	if !utf8.Valid(b) {
		return fmt.Errorf("body is not valid UTF-8 (at byte %d)", len(b)-len(bytes.ToValidUTF8(b, nil)))
	}
	t := bytes.TrimSpace(b)
	if string(t) == "null" {
		return fmt.Errorf("body is null, want a JSON object")
	}
	var seen [len(checkKeys)]bool
	depth := 0
	expectKey := false
	for i := 0; i < len(t); i++ {
		switch c := t[i]; c {
		case '{':
			depth++
			expectKey = depth == 1
		case '[':
			depth++
		case '}', ']':
			depth--
		case ',':
			expectKey = depth == 1
		case '"':
			end, err := stringEnd(t, i)
			if err != nil {
				return err
			}
			if expectKey {
				if err := knownKey(t[i+1:end], &seen); err != nil {
					return err
				}
				expectKey = false
			}
			i = end
		}
	}
	return nil
}

// stringEnd returns the index of the quote closing the JSON string opening at b[at],
// refusing a lone surrogate escape. An unterminated string is the decoder's to report.
func stringEnd(b []byte, at int) (int, error) {
	for i := at + 1; i < len(b); i++ {
		switch b[i] {
		case '"':
			return i, nil
		case '\\':
			if i+1 < len(b) && b[i+1] == 'u' {
				r, ok := hex4(b, i+2)
				switch {
				case ok && r >= 0xD800 && r < 0xDC00: // a high surrogate: a low one must follow
					lo, ok2 := rune(0), false
					if i+7 < len(b) && b[i+6] == '\\' && b[i+7] == 'u' {
						lo, ok2 = hex4(b, i+8)
					}
					if !ok2 || lo < 0xDC00 || lo > 0xDFFF {
						return 0, fmt.Errorf("string at byte %d has a lone surrogate \\u%04X", at, r)
					}
					i += 11
					continue
				case ok && r >= 0xDC00 && r <= 0xDFFF:
					return 0, fmt.Errorf("string at byte %d has a lone surrogate \\u%04X", at, r)
				}
			}
			i++
		}
	}
	return len(b), nil
}

func hex4(b []byte, at int) (rune, bool) {
	if at+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[at : at+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// knownKey checks one top-level key as written: one of checkKeys, exactly, once. Unknown
// keys are the decoder's to refuse (DisallowUnknownFields).
func knownKey(k []byte, seen *[len(checkKeys)]bool) error {
	if bytes.IndexByte(k, '\\') >= 0 {
		return fmt.Errorf("key %.64q is written with escapes; write keys plainly", k)
	}
	for i, name := range checkKeys {
		switch {
		case string(k) == name:
			if seen[i] {
				return fmt.Errorf("key %q given twice", name)
			}
			seen[i] = true
			return nil
		case strings.EqualFold(string(k), name):
			return fmt.Errorf("key %.64q: keys are case-sensitive, write %q", k, name)
		}
	}
	return nil
}
