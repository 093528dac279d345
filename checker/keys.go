package checker

import (
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/checker/rules"
	"github.com/quotaflow/quotaflow/internal/algorithm"
)

// Redis keys follow rl:{dimension:identifier}:{algorithm}:{window}:{endpoint} (docs/architecture.md), with the
// subject as a hash tag so that all of one subject's buckets live in one Redis Cluster slot and
// one Lua call can update them together:
//
//	rl:{user:12345}:tb:1m:/api/*
//
// The algorithm code keeps two rules of different algorithms from reading each other's state;
// the rule's endpoint pattern (not the called path) names the bucket, so one "/api/*" rule is
// one bucket for every path under /api. The tier is not part of the key: a user moving between
// tiers keeps what it consumed.
//
// Identifiers are escaped so that none can leave its namespace: every byte outside a small safe
// set ("{", "}", ":", "%", white space, control and non-ASCII bytes among them) becomes %XX.

// maxTagID bounds the escaped identifier a tag writes out: a longer descriptor (up to 16
// entries of 256 bytes each) is named by its SHA-256 instead, "{descriptor#<base64url>}", which
// no escaped identifier can spell ("#" is escaped) and no two descriptors share.
const maxTagID = 256

// subjectTag returns "{dim:escaped-id}".
func subjectTag(dim rules.Dimension, id string) string {
	if dim == rules.DimensionDescriptor && len(id) > maxTagID {
		sum := sha256.Sum256([]byte(id))
		return "{" + dim.String() + "#" + base64.RawURLEncoding.EncodeToString(sum[:]) + "}"
	}
	var b strings.Builder
	b.Grow(len(id) + 10)
	b.WriteByte('{')
	b.WriteString(dim.String())
	if dim != rules.DimensionGlobal {
		b.WriteByte(':')
		escapeTo(&b, id)
	}
	b.WriteByte('}')
	return b.String()
}

// limitKey returns the bucket key of rule r for the subject with the given tag. A candidate
// rule's ends in "#c:<its id>": its own bucket, never its live rule's, even with the same
// algorithm and window (no endpoint pattern holds a '#').
func limitKey(tag string, r *rules.Rule) string {
	win := windowToken(r.Window)
	code := r.Algorithm.Code()
	if u := r.Calendar.Unit; u.Valid() {
		// A calendar window's own code and unit: "cw:1d" is no "fw:1d" (24h), whose windows
		// are days of UTC since the epoch, with another state in another layout.
		code, win = algorithm.CalendarWindow.Code(), u.String()
	}
	var b strings.Builder
	b.Grow(3 + len(tag) + 1 + len(code) + 1 + len(win) + 1 + len(r.Endpoint))
	b.WriteString("rl:")
	b.WriteString(tag)
	b.WriteByte(':')
	b.WriteString(code)
	b.WriteByte(':')
	b.WriteString(win)
	b.WriteByte(':')
	b.WriteString(r.Endpoint)
	if r.CandidateOf != "" {
		b.WriteString("#c:")
		b.WriteString(r.ID)
	}
	return b.String()
}

// recordKey returns the key of a check's idempotency record, "rl:{dim:id}:i:name", in the
// namespace of the subject with the given tag. name (from idempotency) is 22 base64url
// characters: the client's key is hashed, never written into the key, so none of its bytes
// can reach past it, and the ":i:" marker is outside anything a client chooses. No bucket key
// has "i" for an algorithm code.
func recordKey(tag, name string) string {
	var b strings.Builder
	b.Grow(3 + len(tag) + 3 + len(name))
	b.WriteString("rl:")
	b.WriteString(tag)
	b.WriteString(":i:")
	b.WriteString(name)
	return b.String()
}

// windowToken names a window compactly: 1s, 1m, 1h, 1d, else milliseconds (1500ms).
func windowToken(d time.Duration) string {
	switch {
	case d%(24*time.Hour) == 0:
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "d"
	case d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	case d%time.Minute == 0:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	case d%time.Second == 0:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
}

const hexDigits = "0123456789ABCDEF"

func safeByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~' || c == '@' || c == '/' || c == '+' || c == '='
}

func escapeTo(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; safeByte(c) {
			b.WriteByte(c)
		} else {
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
		}
	}
}

// allowanceKey returns the key of an Allowance's token bucket, "rl:{ns:id}:tb:1m:name": the
// shape of a rule's bucket key, in a namespace no rule dimension uses.
func allowanceKey(ns, id, name string) string {
	var b strings.Builder
	b.WriteString("rl:{")
	b.WriteString(ns)
	b.WriteByte(':')
	escapeTo(&b, id)
	b.WriteString("}:")
	b.WriteString(algorithm.TokenBucket.Code())
	b.WriteString(":1m:")
	escapeTo(&b, name)
	return b.String()
}
