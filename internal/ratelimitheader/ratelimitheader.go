// Package ratelimitheader renders the RateLimit and RateLimit-Policy fields of
// draft-ietf-httpapi-ratelimit-headers-11 as structured fields (RFC 8941): what the checker's
// forward-auth endpoint answers and what checker/client's middleware sets, written once, with
// the rounding of the waits every answer reports (CeilMillis, CeilSeconds).
package ratelimitheader

import (
	"strconv"
	"strings"
	"time"
)

// Limit renders a RateLimit field: the policy's name, the units remaining (never below 0) and
// the seconds until they are available again (never below 0).
func Limit(policy string, remaining, resetSeconds int64) string {
	var b strings.Builder
	writeString(&b, policy)
	b.WriteString(";r=")
	b.WriteString(strconv.FormatInt(max(0, remaining), 10))
	b.WriteString(";t=")
	b.WriteString(strconv.FormatInt(max(0, resetSeconds), 10))
	return b.String()
}

// Policies builds a RateLimit-Policy field, one item per Add.
type Policies struct{ b strings.Builder }

// Add appends a policy: its name, quota and window (whole seconds, at least 1). burst, when it
// differs from quota, is quotaflow's own parameter for what a bucket admits at once; parsers
// ignore parameters they do not know.
func (p *Policies) Add(name string, quota int64, window time.Duration, burst int64) {
	if p.b.Len() > 0 {
		p.b.WriteString(", ")
	}
	writeString(&p.b, name)
	p.b.WriteString(";q=")
	p.b.WriteString(strconv.FormatInt(quota, 10))
	p.b.WriteString(";w=")
	p.b.WriteString(strconv.FormatInt(max(1, int64(window/time.Second)), 10))
	if burst != 0 && burst != quota {
		p.b.WriteString(";burst=")
		p.b.WriteString(strconv.FormatInt(burst, 10))
	}
}

// String is the field's value; empty when no policy was added.
func (p *Policies) String() string { return p.b.String() }

// writeString writes s as a structured-field String (RFC 8941 section 3.3.3): only printable
// ASCII, with " and \ escaped. Go's %q differs for anything else (\t, \u00e9), which a
// structured-field parser rejects, so such bytes become '?'.
func writeString(b *strings.Builder, s string) {
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('?')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
}

// CeilMillis is d in whole milliseconds, rounded up: a wait is never reported shorter than it
// is (retry_after_ms).
func CeilMillis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// CeilSeconds is ms in whole seconds, rounded up (Retry-After, retry_after, the RateLimit
// field's t).
func CeilSeconds(ms int64) int64 { return (ms + 999) / 1000 }
