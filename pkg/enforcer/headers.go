package enforcer

import "strconv"

// Response header field names. The RateLimit fields follow
// draft-ietf-httpapi-ratelimit-headers-11 (May 2026): both are Structured Field Lists
// whose members are a quoted policy name with parameters —
//
//	RateLimit-Policy: "<policy>";q=<quota>;w=<window seconds>
//	RateLimit:        "<policy>";r=<available quota>;t=<effective window seconds>
//
// The policy is the deciding limit ("<rule id>/<limit name>"), a token bucket stated as
// q = burst per w = burst ÷ rate. The RateLimit field says the same at the caller's
// level: r = the whole tokens left, t = how long they last at the limit's rate (r ÷
// rate, rounded up, jittered per key), so r/t never exceeds q/w, a full bucket reads
// exactly as the policy, and a client that spends r over t goes at the limit's rate —
// the bucket refills meanwhile, so it errs under. On a refusal t never passes
// Retry-After. (The time until the bucket is full, Decision.Reset, would tell a client
// with few tokens left to spend them over many times longer than the limit requires.)
// No partition key (pk) is sent: a caller sees only its own budget and never another
// identity.
const (
	HeaderRateLimitPolicy = "RateLimit-Policy"
	HeaderRateLimit       = "RateLimit"
	HeaderRetryAfter      = "Retry-After"
	// HeaderRule names the rule that refused (on refusals only).
	HeaderRule = "X-RateLimit-Rule"
	// HeaderCountedBy says what the deciding rule counted the request by (Decision.
	// CountedBy): "ip" tells a keyless caller it was limited per address, "anonymous"
	// that it shares one budget with every caller that sent neither key nor address.
	HeaderCountedBy = "X-RateLimit-Counted-By"
)

// Header is one HTTP response header field.
type Header struct{ Name, Value string }

// AppendHeaders appends the response header fields for d: RateLimit-Policy, RateLimit and
// X-RateLimit-Counted-By when a rule decided, and on a refusal Retry-After (whole seconds,
// rounded up; absent when retrying cannot help) and X-RateLimit-Rule. A decision with no
// rule adds nothing.
func (d *Decision) AppendHeaders(dst []Header) []Header {
	if d.Rule == "" {
		return dst
	}
	// Every value that is not a constant is written into one buffer and made one string,
	// which the values are cut from: one allocation for all of them.
	var buf [256]byte
	b := d.AppendPolicy(buf[:0])
	policy := len(b)
	b = d.AppendRateLimit(b)
	current, retry := len(b), len(b)
	if !d.Allowed {
		if s := d.RetryAfterSeconds(); s > 0 {
			b = strconv.AppendInt(b, s, 10)
		}
		retry = len(b)
		b = appendToken(b, d.Rule)
	}
	v := string(b)
	dst = append(dst, Header{HeaderRateLimitPolicy, v[:policy]}, Header{HeaderRateLimit, v[policy:current]})
	if d.CountedBy != "" {
		dst = append(dst, Header{HeaderCountedBy, d.CountedBy})
	}
	if !d.Allowed {
		if retry > current {
			dst = append(dst, Header{HeaderRetryAfter, v[current:retry]})
		}
		dst = append(dst, Header{HeaderRule, v[retry:]})
	}
	return dst
}

// AppendPolicy appends the RateLimit-Policy member for d: "<policy>";q=<quota>;w=<window>.
func (d *Decision) AppendPolicy(b []byte) []byte {
	b = appendSFString(b, d.Limit)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, d.Quota, 10)
	b = append(b, ";w="...)
	return strconv.AppendInt(b, d.Window, 10)
}

// AppendRateLimit appends the RateLimit member for d:
// "<policy>";r=<available quota>;t=<effective window> (EffectiveSeconds).
func (d *Decision) AppendRateLimit(b []byte) []byte {
	b = appendSFString(b, d.Limit)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, max(d.Remaining, 0), 10)
	b = append(b, ";t="...)
	return strconv.AppendInt(b, d.EffectiveSeconds(), 10)
}

// appendSFString appends s as a Structured Field String (RFC 9651 §3.3.3): quoted, with
// '"' and '\' escaped. Bytes outside printable ASCII, which an sf-string cannot hold,
// become '_'.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '_')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}

// appendToken appends s with every byte that is not printable ASCII replaced by '_', so a
// rule id can never split or smuggle a header.
func appendToken(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e {
			c = '_'
		}
		b = append(b, c)
	}
	return b
}
