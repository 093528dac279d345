package transport

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/http"

	"connectrpc.com/connect"
)

// DefaultMaxRequestBytes is Config.MaxRequestBytes's default: grpc-go's own default bound on a
// received message. A full batch of MaxBatchChecks checks at their longest fields fits in it.
const DefaultMaxRequestBytes = 4 << 20

// limitBodies refuses requests whose body is larger than s.maxBody, before authentication or
// decoding spends anything on them: a declared Content-Length over the bound is answered at
// once, and any other body is cut at the bound (http.MaxBytesReader, which also closes an
// HTTP/1.1 connection instead of draining the rest). RPCs are answered ResourceExhausted in
// their own protocol (connect-go's own answer to a message over WithReadMaxBytes; HTTP 429 in
// the Connect protocol, status 8 in gRPC and gRPC-Web), anything else 413.
func (s *Server) limitBodies(h http.Handler) http.Handler {
	errs := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > s.maxBody {
			err := fmt.Errorf("request body: %d bytes, at most %d accepted", r.ContentLength, s.maxBody)
			// Closed unread: net/http then ends an HTTP/1.1 connection (it cannot serve another
			// request) after letting the client read this answer, and HTTP/2 resets the stream.
			r.Body.Close()
			if errs.IsSupported(r) {
				_ = errs.Write(w, r, connect.NewError(connect.CodeResourceExhausted, err))
				return
			}
			writeJSONError(w, http.StatusRequestEntityTooLarge, "request_too_large", err.Error())
			return
		}
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = http.MaxBytesReader(w, r.Body, s.maxBody)
		}
		h.ServeHTTP(w, r)
	})
}

// handlerOptions are the options of every connect-go handler Handler mounts: the message size
// bound, decompressed size included.
func (s *Server) handlerOptions() []connect.HandlerOption {
	maxBody := s.maxBody
	return []connect.HandlerOption{
		connect.WithReadMaxBytes(int(maxBody)),
		// connect-go stops inflating a message at WithReadMaxBytes, but then inflates the
		// rest to report its size: a few hundred KB of gzip would cost seconds of CPU.
		connect.WithCompression("gzip",
			func() connect.Decompressor { return &boundedGzip{max: maxBody} },
			func() connect.Compressor { return gzip.NewWriter(nil) }),
	}
}

// errInflatedTooLarge ends a boundedGzip's output.
var errInflatedTooLarge = errors.New("decompressed message over the size bound")

// boundedGzip is a gzip decompressor that yields at most max+1 bytes of a message (enough for
// connect-go to tell it is over max) and then fails, rather than inflating the rest.
type boundedGzip struct {
	gz   gzip.Reader
	max  int64
	left int64
}

func (d *boundedGzip) Read(p []byte) (int, error) {
	if d.left <= 0 {
		return 0, errInflatedTooLarge
	}
	if int64(len(p)) > d.left {
		p = p[:d.left]
	}
	n, err := d.gz.Read(p)
	d.left -= int64(n)
	return n, err
}

func (d *boundedGzip) Reset(r io.Reader) error {
	d.left = d.max + 1
	return d.gz.Reset(r)
}

func (d *boundedGzip) Close() error { return d.gz.Close() }
