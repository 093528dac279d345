// Package urlpath puts request paths in one normal form, so that every spelling a router or a
// backend takes for the same resource is matched and counted as that resource: a rate limit on
// /api/v1/search must not be escaped by asking for /api/v1/./search, /API/v1/search or
// /api/v1/%73earch.
//
// The normal form follows RFC 3986 section 6 (syntax- and scheme-based normalisation) and what
// routers route on (Envoy's normalize_path and merge_slashes, nginx's $uri), and is stricter
// where backends disagree, so that no spelling counts less than the canonical one:
//
//   - the query and fragment ("?…", "#…") are dropped;
//   - percent-encoded unreserved characters (ALPHA DIGIT - . _ ~) are decoded, other escapes
//     keep their byte with upper-case hex digits, and bytes a path may not hold raw (space,
//     '"', '<', '>', '[', ']', '^', '`', '{', '|', '}', non-ASCII) are encoded;
//   - ASCII letters are folded to lower case (RFC 3986 makes paths case-sensitive, but a
//     case-insensitive backend serves /API/v1/search as /api/v1/search: counting both as one
//     costs a case-sensitive backend nothing but its 404s);
//   - path parameters are dropped: ";…" up to the next '/' (servlet containers route
//     /api/v1/search;x as /api/v1/search and /x/..;/ as /x/../); an encoded ';' (%3B) stays;
//   - dot segments are resolved (RFC 3986 section 5.2.4), empty segments ("//") and a
//     trailing slash removed: "/" is the only path ending in '/'.
//
// Some paths mean different things to different backends, or nothing good to any; they are
// refused rather than guessed at (nginx answers 400 to the last two itself): a path not
// starting with '/', an encoded slash (%2F), a backslash raw or encoded (%5C), a control
// character raw or encoded (%00, line breaks), a '%' not followed by two hex digits, and ".."
// climbing above the root.
package urlpath

import (
	"bytes"
	"errors"
	"strings"
)

// The reasons a path is refused. Their texts complete a sentence naming the path's field
// ("endpoint: …").
var (
	ErrNotAbsolute  = errors.New(`must be an absolute path, starting with "/"`)
	ErrEncodedSlash = errors.New("holds an encoded slash (%2F), which routers and backends read differently")
	ErrBackslash    = errors.New(`holds a backslash ("\" or %5C), which some backends read as "/"`)
	ErrControl      = errors.New("holds a control character (such as NUL or a line break), raw or percent-encoded")
	ErrBadEscape    = errors.New(`holds a "%" not followed by two hexadecimal digits`)
	ErrAboveRoot    = errors.New(`climbs above the root with ".."`)
)

// byte classes of a path's raw bytes.
const (
	classKeep    = iota // kept as it is: lower-case letters, digits, - . _ ~ ! $ & ' ( ) * + , = : @
	classUpper          // an upper-case letter: folded
	classSlash          // '/': ends a segment
	classPercent        // '%': starts an escape
	classParam          // ';': starts the segment's parameters, dropped
	classEncode         // a byte a path may not hold raw: percent-encoded
	classRefuse         // a control character or a backslash: the path is refused
)

var classes = func() (c [256]uint8) {
	for i := range c {
		switch b := byte(i); {
		case b < 0x20 || b == 0x7f || b == '\\':
			c[i] = classRefuse
		case 'A' <= b && b <= 'Z':
			c[i] = classUpper
		case 'a' <= b && b <= 'z', '0' <= b && b <= '9', strings.IndexByte("-._~!$&'()*+,=:@", b) >= 0:
			c[i] = classKeep
		case b == '/':
			c[i] = classSlash
		case b == '%':
			c[i] = classPercent
		case b == ';':
			c[i] = classParam
		default:
			c[i] = classEncode
		}
	}
	return c
}()

// unreserved reports whether RFC 3986 lets b be written raw with the same meaning as its
// escape: such escapes are decoded.
func unreserved(b byte) bool {
	return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '-' || b == '.' || b == '_' || b == '~'
}

// Path returns p without its query and fragment.
func Path(p string) string {
	if i := strings.IndexAny(p, "?#"); i >= 0 {
		return p[:i]
	}
	return p
}

// Normalize returns p in normal form (see the package comment), or why p is refused: one of
// the package's Err values. A path already normal is returned as it is, without allocating.
func Normalize(p string) (string, error) {
	p = Path(p)
	if p == "" || p[0] != '/' {
		return "", ErrNotAbsolute
	}
	if normal(p) {
		return p, nil
	}
	return rewrite(p)
}

// normal reports whether Normalize would return p unchanged. It sends every path it is unsure
// of to rewrite, which refuses or rewrites it: only its true answers must be exact.
func normal(p string) bool {
	if p == "/" {
		return true
	}
	start := 1 // the first byte of the current segment
	for i := 1; i < len(p); i++ {
		switch classes[p[i]] {
		case classKeep:
		case classSlash:
			if dotOrEmpty(p[start:i]) {
				return false
			}
			start = i + 1
		case classPercent:
			if i+2 >= len(p) || !upperHex(p[i+1]) || !upperHex(p[i+2]) {
				return false
			}
			if b := unhex(p[i+1])<<4 | unhex(p[i+2]); unreserved(b) || b == '/' || classes[b] == classRefuse {
				return false
			}
			i += 2
		default:
			return false
		}
	}
	return !dotOrEmpty(p[start:])
}

func dotOrEmpty(seg string) bool { return seg == "" || seg == "." || seg == ".." }

// rewrite builds the normal form of p, an absolute path without query or fragment, segment by
// segment into one buffer: a ".." segment cuts the buffer back to its previous '/'.
func rewrite(p string) (string, error) {
	// Encoding triples a byte: most paths need less, and append grows the rest.
	out := make([]byte, 0, len(p)+8)
	for i := 0; i < len(p); {
		// p[i] is the '/' opening a segment.
		segStart := len(out)
		out = append(out, '/')
		i++
		inParams := false
		for ; i < len(p) && p[i] != '/'; i++ {
			c := p[i]
			if inParams && c != '%' {
				if classes[c] == classRefuse {
					return "", refusal(c)
				}
				continue
			}
			switch classes[c] {
			case classKeep:
				out = append(out, c)
			case classUpper:
				out = append(out, c+('a'-'A'))
			case classParam:
				inParams = true
			case classEncode:
				out = appendEscape(out, c)
			case classRefuse:
				return "", refusal(c)
			case classPercent:
				if i+2 >= len(p) || !isHex(p[i+1]) || !isHex(p[i+2]) {
					return "", ErrBadEscape
				}
				b := unhex(p[i+1])<<4 | unhex(p[i+2])
				i += 2
				switch {
				case b == '/':
					return "", ErrEncodedSlash
				case classes[b] == classRefuse:
					return "", refusal(b)
				case inParams:
				case unreserved(b):
					out = append(out, lower(b))
				default:
					out = appendEscape(out, b)
				}
			}
		}
		switch seg := out[segStart+1:]; {
		case len(seg) == 0, len(seg) == 1 && seg[0] == '.':
			out = out[:segStart]
		case len(seg) == 2 && seg[0] == '.' && seg[1] == '.':
			out = out[:segStart]
			j := bytes.LastIndexByte(out, '/')
			if j < 0 {
				return "", ErrAboveRoot
			}
			out = out[:j]
		}
	}
	if len(out) == 0 {
		return "/", nil
	}
	return string(out), nil
}

func refusal(c byte) error {
	if c == '\\' {
		return ErrBackslash
	}
	return ErrControl
}

const upperDigits = "0123456789ABCDEF"

func appendEscape(out []byte, b byte) []byte {
	return append(out, '%', upperDigits[b>>4], upperDigits[b&15])
}

func isHex(c byte) bool { return upperHex(c) || 'a' <= c && c <= 'f' }

func upperHex(c byte) bool { return '0' <= c && c <= '9' || 'A' <= c && c <= 'F' }

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c <= 'F':
		return c - 'A' + 10
	}
	return c - 'a' + 10
}

func lower(b byte) byte {
	if 'A' <= b && b <= 'Z' {
		return b + ('a' - 'A')
	}
	return b
}
