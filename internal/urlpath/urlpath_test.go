package urlpath

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// spellings are the forms of /api/v1/search that reached a looser bucket, or none, before
// endpoints were normalised (issue 20, item 3), and more of the same kinds. Every protocol's
// test and the gateways' test send them all.
var spellings = []string{
	"/api/v1/search/",
	"//api/v1/search",
	"/api//v1/search",
	"/api/v1/./search",
	"/api/v1/x/../search",
	"/api/v1/%73earch",
	"/api/v1/search;x",
	"/API/v1/search",
	"/%61pi/v1/search",
	"/x/../api/v1/search",
	"/api/v1/search?q=1",
	"/api/v1/search#top",
	"///api///v1///search///",
	"/./api/v1/search/.",
	"/api/v1/%2e/search",
	"/api/v1/x/%2E%2E/search",
	"/api/v1/x/..;/search",
	"/api;v=1/v1/search;jsessionid=7?q=1",
	"/api/v1/%53EARCH",
	"/api/v1/search/x/..",
	"/Api/V1/Search/",
}

func TestNormalize(t *testing.T) {
	t.Parallel()
	for _, p := range spellings {
		t.Run(p, func(t *testing.T) {
			t.Parallel()
			if got, err := Normalize(p); got != "/api/v1/search" || err != nil {
				t.Errorf("Normalize(%q) = %q, %v; want /api/v1/search", p, got, err)
			}
		})
	}
	for _, tc := range []struct{ in, want string }{
		{"/", "/"},
		{"//", "/"},
		{"/.", "/"},
		{"/./", "/"},
		{"/a/..", "/"},
		{"/a/../", "/"},
		{"/.;x", "/"},
		{"/;x", "/"},
		{"/a/b/../../c", "/c"},
		{"/a/./b/../c/", "/a/c"},
		{"/api/v1/orders", "/api/v1/orders"},
		{"/...", "/..."}, // not a dot segment
		{"/a/.../b", "/a/.../b"},
		{"/.a/..b/b..", "/.a/..b/b.."},
		{"/a%2a", "/a%2A"},     // '*' is reserved: its escape stays, hex in upper case
		{"/a*", "/a*"},         // and raw it stays raw: RFC 3986 keeps them apart
		{"/a%3bb", "/a%3Bb"},   // an encoded ';' is data, not parameters
		{"/a%3Fb", "/a%3Fb"},   // so is an encoded '?'
		{"/a%25", "/a%25"},     // and '%'
		{"/a%2541", "/a%2541"}, // no double decoding
		{"/a%7e%2D%5f%2E", "/a~-_."},
		{"/a%41%5A", "/aaz"}, // decoded letters fold too
		{"/a b", "/a%20b"},   // bytes a path may not hold raw are encoded
		{"/a%20b", "/a%20b"},
		{"/ü", "/%C3%BC"},
		{"/%c3%bc", "/%C3%BC"},
		{"/a|b{c}", "/a%7Cb%7Bc%7D"},
		{`/"<>[]^` + "`", "/%22%3C%3E%5B%5D%5E%60"},
		{"/a:b@c!$&'()*+,=", "/a:b@c!$&'()*+,="},
		{"/a;b=%41C/d", "/a/d"}, // parameters dropped, whatever they hold...
		{"/x?a/../..", "/x"},    // ...and the query is not the path
		{"/x#/../..", "/x"},
		{"/A%2A/..", "/"},
		{"/quotaflow.v1.RateLimiter/CheckRateLimit", "/quotaflow.v1.ratelimiter/checkratelimit"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			t.Parallel()
			if got, err := Normalize(tc.in); got != tc.want || err != nil {
				t.Errorf("Normalize(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestNormalizeRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want error
	}{
		{"", ErrNotAbsolute},
		{"api/v1/search", ErrNotAbsolute},
		{"*", ErrNotAbsolute},
		{"?x=/a", ErrNotAbsolute},
		{"http://host/api", ErrNotAbsolute},
		{"%2Fapi", ErrNotAbsolute},
		{"/a%2Fb", ErrEncodedSlash},
		{"/a%2fb", ErrEncodedSlash},
		{"/a;%2F", ErrEncodedSlash}, // in parameters too: nothing a backend splits on is passed over
		{`/a\b`, ErrBackslash},
		{"/a%5cb", ErrBackslash},
		{"/a%5C", ErrBackslash},
		{"/a%00", ErrControl},
		{"/a\x00", ErrControl},
		{"/a\nb", ErrControl},
		{"/a%0d%0A", ErrControl},
		{"/a%7F", ErrControl},
		{"/a;\x01", ErrControl},
		{"/a\tb", ErrControl},
		{"/a%", ErrBadEscape},
		{"/a%2", ErrBadEscape},
		{"/a%zz", ErrBadEscape},
		{"/a%g0", ErrBadEscape},
		{"/a%%41", ErrBadEscape},
		{"/..", ErrAboveRoot},
		{"/../api", ErrAboveRoot},
		{"/a/../..", ErrAboveRoot},
		{"/x/%2e%2e/%2E%2e/api", ErrAboveRoot},
		{"/..;/api", ErrAboveRoot},
		{"//../api", ErrAboveRoot},
	} {
		t.Run(tc.in, func(t *testing.T) {
			t.Parallel()
			if got, err := Normalize(tc.in); !errors.Is(err, tc.want) || got != "" {
				t.Errorf("Normalize(%q) = %q, %v; want error %v", tc.in, got, err, tc.want)
			}
		})
	}
}

// normalPaths are already normal: Normalize returns them as they are, allocating nothing.
var normalPaths = []string{
	"/",
	"/api/v1/search",
	"/api/v1/orders/12345/items",
	"/api/v1/search?q=rate+limiter&page=2", // the query is cut off the string, not copied
	"/files/%C3%BC%20x/a%3Bb",
	"/a:b@c!$&'()*+,=-._~",
}

func TestNormalizeNormalAllocatesNothing(t *testing.T) {
	for _, p := range normalPaths {
		if got, err := Normalize(p); got != Path(p) || err != nil {
			t.Errorf("Normalize(%q) = %q, %v; want it as it is", p, got, err)
		}
		if n := testing.AllocsPerRun(100, func() { Normalize(p) }); n != 0 {
			t.Errorf("Normalize(%q) allocates %v times, want 0", p, n)
		}
	}
}

// FuzzNormalize checks what the limiter relies on for any input: no panic; a result or an
// error, never both; a result that is its own normal form (so normalising twice, in two
// places, agrees), that the fast path returns as it is, that every other spelling of it
// (respell) normalises back to, and that holds no dot segment, empty segment, upper-case
// letter, parameter, query or character a backend could read as another path.
func FuzzNormalize(f *testing.F) {
	for i, p := range spellings {
		f.Add(p, uint64(i)*0x0123456789abcdef)
	}
	for _, p := range normalPaths {
		f.Add(p, uint64(0x0706050403020100))
	}
	for _, p := range []string{"", "/..", "/a/%2e%2E/b", "/a;b/..;/c", `/a\b`, "/a%00", "/%c3%bc", "/ü", "/a%2", "//../x"} {
		f.Add(p, uint64(0))
	}
	f.Fuzz(func(t *testing.T, p string, ops uint64) {
		got, err := Normalize(p)
		if err != nil {
			if got != "" {
				t.Fatalf("Normalize(%q) = %q and error %v: want one of them", p, got, err)
			}
			return
		}
		if s := respell(got, ops); s != got {
			if n, err := Normalize(s); n != got || err != nil {
				t.Fatalf("Normalize(%q) = %q, but its spelling %q normalises to %q, %v", p, got, s, n, err)
			}
		}
		again, err := Normalize(got)
		if again != got || err != nil {
			t.Fatalf("Normalize(%q) = %q, but Normalize(%q) = %q, %v: not idempotent", p, got, got, again, err)
		}
		if !normal(got) {
			t.Fatalf("Normalize(%q) = %q, which the fast path does not take as normal", p, got)
		}
		if got == "/" {
			return
		}
		if !strings.HasPrefix(got, "/") || strings.HasSuffix(got, "/") || strings.Contains(got, "//") ||
			strings.ContainsAny(got, "?#;\\") || strings.ToLower(got) != lowerOutsideEscapes(got) {
			t.Fatalf("Normalize(%q) = %q: not in normal form", p, got)
		}
		for _, seg := range strings.Split(got[1:], "/") {
			if seg == "." || seg == ".." {
				t.Fatalf("Normalize(%q) = %q holds a dot segment", p, got)
			}
		}
		for i := 0; i < len(got); i++ {
			if c := got[i]; c < 0x21 || c >= 0x7f {
				t.Fatalf("Normalize(%q) = %q holds byte %#x raw", p, got, c)
			}
		}
	})
}

// respell writes normal path n in another spelling that must normalise back to n: each 3 bits
// of ops pick a change (case, a "." or "zz/.." segment, a doubled or trailing slash, an
// unreserved character escaped, ";" parameters, a query), the next bits where it goes.
func respell(n string, ops uint64) string {
	var segs []string
	if n != "/" {
		segs = strings.Split(n[1:], "/")
	}
	for ; ops != 0; ops >>= 8 {
		at := int(ops>>3&31) % (len(segs) + 1)
		switch ops & 7 {
		case 0:
			segs = slices.Insert(segs, at, ".")
		case 1:
			segs = slices.Insert(segs, at, "zz", "..")
		case 2:
			segs = slices.Insert(segs, at, "")
		case 3:
			segs = append(segs, "")
		case 4:
			if at < len(segs) {
				segs[at] += ";v=1"
			}
		case 5:
			if at < len(segs) {
				segs[at] = escapeUnreserved(segs[at])
			}
		case 6:
			if at < len(segs) {
				segs[at] = upperOutsideEscapes(segs[at])
			}
		case 7:
			segs = append(segs[:len(segs):len(segs)], "") // trailing slash, then a query
			segs[len(segs)-1] = "?q=/../x"
		}
	}
	return "/" + strings.Join(segs, "/")
}

// escapeUnreserved percent-encodes, in lower-case hex, the first unreserved character of seg
// that is not part of an escape.
func escapeUnreserved(seg string) string {
	for i := 0; i < len(seg); i++ {
		switch c := seg[i]; {
		case c == '%':
			i += 2
		case unreserved(c):
			return seg[:i] + fmt.Sprintf("%%%02x", c) + seg[i+1:]
		}
	}
	return seg
}

// upperOutsideEscapes upper-cases the letters of seg but for escapes' hex digits.
func upperOutsideEscapes(seg string) string {
	b := []byte(seg)
	for i := 0; i < len(b); i++ {
		switch {
		case b[i] == '%':
			i += 2
		case 'a' <= b[i] && b[i] <= 'z':
			b[i] -= 'a' - 'A'
		}
	}
	return string(b)
}

// lowerOutsideEscapes lower-cases s but for the hex digits of its escapes, which the normal
// form writes in upper case: equal to strings.ToLower(s) only when s has no other capital.
func lowerOutsideEscapes(s string) string {
	b := []byte(strings.ToLower(s))
	for i := 0; i < len(b); i++ {
		if b[i] == '%' && i+2 < len(b) {
			b[i+1], b[i+2] = s[i+1]|0x20, s[i+2]|0x20
			i += 2
		}
	}
	return string(b)
}

// BenchmarkNormalize measures the normal paths (the common case, which must not allocate) and
// paths to rewrite.
func BenchmarkNormalize(b *testing.B) {
	for _, bc := range []struct{ name, path string }{
		{"normal/short", "/api/v1/search"},
		{"normal/query", "/api/v1/search?q=rate+limiter&page=2"},
		{"normal/long", "/api/v1/projects/" + strings.Repeat("0123456789abcdef/", 12) + "items"},
		{"rewrite/case", "/API/v1/Search"},
		{"rewrite/mixed", "//api/v1/x/../%73earch;jsessionid=7/"},
		{"rewrite/encode", "/files/über uns/ü"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.path)))
			for b.Loop() {
				if _, err := Normalize(bc.path); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
