package rules

import "strings"

// NormalizeEndpoint returns the form an endpoint ("<METHOD> <path>", or a path alone) is
// matched in, so one route has one spelling and a limit cannot be stepped around by
// writing it another way. The rule, applied to the path (the query and fragment are the
// gateway's to drop; anything after '?' or '#' is cut here too):
//
//   - ";params" are cut from every segment ("/v1/login;x" is "/v1/login");
//   - percent-encoded unreserved characters (A-Z a-z 0-9 - . _ ~) are decoded ("%6c" is
//     "l"); other escapes stay, with their hex digits upper-cased;
//   - repeated slashes are one, "." segments are dropped and ".." removes the segment
//     before it (never above the root), as RFC 3986 section 5.2.4 says;
//   - a trailing slash is dropped (the root "/" stays);
//   - ASCII letters are lower-cased: allot treats paths as case-insensitive, as the
//     routers most APIs sit behind do, so "/V1/login" counts as "/v1/login".
//
// The method is upper-cased. Rules' endpoints are normalised the same way when compiled.
// An endpoint already in this form is returned as is, without allocating.
func NormalizeEndpoint(ep string) string {
	method, path, hasMethod := strings.Cut(ep, " ")
	if !hasMethod {
		method, path = "", ep
	}
	if !strings.HasPrefix(path, "/") { // not a path (a method alone, a name): as is
		return ep
	}
	if normalMethod(method) && normalPath(path) {
		return ep
	}
	p := normalizePath(path)
	m := strings.ToUpper(method)
	if !hasMethod {
		return p
	}
	return m + " " + p
}

func normalMethod(m string) bool {
	for i := 0; i < len(m); i++ {
		if c := m[i]; c >= 'a' && c <= 'z' {
			return false
		}
	}
	return true
}

// normalPath reports whether p is already normalised: the check path's common case.
func normalPath(p string) bool {
	if len(p) > 1 && p[len(p)-1] == '/' {
		return false
	}
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '%' || c == ';' || c == '?' || c == '#' || c >= 'A' && c <= 'Z':
			return false
		case c == '/' && i+1 < len(p) && (p[i+1] == '/' || p[i+1] == '.'):
			return false
		}
	}
	return true
}

func unreserved(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~'
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

func normalizePath(p string) string {
	if i := strings.IndexAny(p, "?#"); i >= 0 {
		p = p[:i]
	}
	rooted := strings.HasPrefix(p, "/")
	var out []string
	for _, seg := range strings.Split(p, "/") {
		if i := strings.IndexByte(seg, ';'); i >= 0 {
			seg = seg[:i]
		}
		seg = decodeSegment(seg)
		switch seg {
		case "", ".":
			continue
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
			continue
		}
		out = append(out, seg)
	}
	s := strings.Join(out, "/")
	if rooted {
		s = "/" + s
	}
	return s
}

// decodeSegment decodes escaped unreserved characters, upper-cases the hex of the other
// escapes and lower-cases ASCII letters.
func decodeSegment(seg string) string {
	var b strings.Builder
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		if c == '%' && i+2 < len(seg) {
			hi, ok1 := unhex(seg[i+1])
			lo, ok2 := unhex(seg[i+2])
			if ok1 && ok2 {
				if d := hi<<4 | lo; unreserved(d) {
					c = d
				} else {
					b.WriteByte('%')
					b.WriteString(strings.ToUpper(seg[i+1 : i+3]))
					i += 2
					continue
				}
				i += 2
			}
		}
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		b.WriteByte(c)
	}
	return b.String()
}
