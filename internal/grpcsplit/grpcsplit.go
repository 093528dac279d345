// Package grpcsplit splits one listener in two: cleartext HTTP/2 connections whose first request
// is gRPC go to one listener, for grpc-go's server, and every other connection (HTTP/1.1, and
// h2c carrying Connect or gRPC-Web) to the other, for net/http.
//
// Both servers then share one port, and gRPC clients (Envoy, grpc-go, grpcurl) get grpc-go's
// HTTP/2 transport, which costs a fraction of net/http's per call. A connection is sorted once,
// by its first request's content-type, read with HPACK before either server sees a byte; every
// byte read is then replayed to the chosen server.
//
// grpc-go clients send no request before they have the server's SETTINGS frame, so the splitter
// writes an empty one first. The server chosen later sends its own as well, and the client
// acknowledges both; grpc-go ignores acknowledgements, but net/http's HTTP/2 server closes a
// connection that acknowledges settings it never sent, so the first acknowledgement is removed
// from what net/http reads.
package grpcsplit

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Config tunes a Splitter and the servers behind it. The zero value is usable; the defaults
// are set in one place, withDefaults.
type Config struct {
	// SniffTimeout bounds how long a new connection may take to show its first request
	// (default 10s); one that takes longer is closed.
	SniffTimeout time.Duration
	// MaxSniffFrames bounds the frames read before the first HEADERS frame (default 16); a
	// connection that sends more goes to net/http, which judges it.
	MaxSniffFrames int
	// MaxConns caps the connections open at once (default 10,000; keep it below the
	// process's file limit, ulimit -n). Past it new connections wait in the kernel's listen
	// backlog until one closes, and a warning says so: the process keeps the file handles it
	// needs for Redis, NATS and the connections it serves.
	MaxConns int
	// ReadHeaderTimeout bounds reading a request's headers (default 10s), ReadTimeout the
	// whole request, body included (default 10s; per stream on HTTP/2), and IdleTimeout how
	// long a connection may wait for its next request (default 2m; gRPC connections get a
	// GOAWAY). Each only applies to the servers made by NewHTTPServer and given
	// GRPCServerOptions.
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	IdleTimeout       time.Duration
	// Logger receives accept errors and the connection cap's warnings, with
	// "component"="grpcsplit" (default: discarded).
	Logger *slog.Logger
}

// Defaults of Config.
const (
	DefaultMaxConns          = 10_000
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 10 * time.Second
	DefaultIdleTimeout       = 2 * time.Minute
)

// withDefaults is cfg with every unset field at its default.
func (cfg Config) withDefaults() Config {
	if cfg.SniffTimeout <= 0 {
		cfg.SniffTimeout = 10 * time.Second
	}
	if cfg.MaxSniffFrames <= 0 {
		cfg.MaxSniffFrames = 16
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.ReadHeaderTimeout <= 0 {
		cfg.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg
}

// Splitter accepts connections from one listener and hands each to the GRPC or the HTTP
// listener. Run Serve; Close stops it and both listeners.
type Splitter struct {
	ln         net.Listener
	cfg        Config
	log        *slog.Logger
	grpc, http *listener
	slots      chan struct{} // one per open connection, up to cfg.MaxConns
	lastFull   time.Time     // when the cap was last logged; Serve's alone
	closed     chan struct{}
	closeOnce  sync.Once
}

// New returns a Splitter of ln's connections.
func New(ln net.Listener, cfg Config) *Splitter {
	cfg = cfg.withDefaults()
	return &Splitter{
		ln:     ln,
		cfg:    cfg,
		log:    cfg.Logger.With("component", "grpcsplit"),
		grpc:   newListener(ln.Addr()),
		http:   newListener(ln.Addr()),
		slots:  make(chan struct{}, cfg.MaxConns),
		closed: make(chan struct{}),
	}
}

// GRPC returns the listener of h2c connections whose first request is gRPC.
func (s *Splitter) GRPC() net.Listener { return s.grpc }

// HTTP returns the listener of every other connection.
func (s *Splitter) HTTP() net.Listener { return s.http }

// Serve accepts connections until the listener is closed; it returns nil after Close. Accept
// errors that pass (no file handle left, EMFILE or ENFILE; no kernel memory; a connection
// aborted before it was accepted) are logged and retried after 5ms, doubling to 1s, as
// net/http's Server.Serve does: connections already open keep being served meanwhile. Any
// other error ends Serve.
func (s *Splitter) Serve() error {
	var delay time.Duration
	for {
		if !s.acquire() {
			return nil
		}
		c, err := s.ln.Accept()
		if err != nil {
			s.release()
			select {
			case <-s.closed:
				return nil
			default:
			}
			if !passing(err) {
				return err
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.log.Warn("accept failed; retrying", "err", err, "retry_in", delay)
			select {
			case <-time.After(delay):
			case <-s.closed:
				return nil
			}
			continue
		}
		delay = 0
		go s.sort(&slotConn{Conn: c, release: s.release})
	}
}

// acquire takes a connection slot, waiting for one while MaxConns connections are open; it
// reports false when the Splitter is closed meanwhile.
func (s *Splitter) acquire() bool {
	select {
	case s.slots <- struct{}{}:
		return true
	default:
	}
	// Once a minute at most: a cap held by a flood would otherwise log at its pace.
	if now := time.Now(); now.Sub(s.lastFull) >= time.Minute {
		s.lastFull = now
		s.log.Warn("connection limit reached: new connections wait in the listen backlog until one closes",
			"max_conns", s.cfg.MaxConns)
	}
	select {
	case s.slots <- struct{}{}:
		return true
	case <-s.closed:
		return false
	}
}

func (s *Splitter) release() { <-s.slots }

// passing reports whether an accept error may pass: the listener is still good, the next
// accept may succeed.
func passing(err error) bool {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM,
			syscall.ECONNABORTED, syscall.ECONNRESET, syscall.EINTR, syscall.EAGAIN:
			return true
		}
	}
	var ne interface {
		Timeout() bool
		Temporary() bool
	}
	return errors.As(err, &ne) && (ne.Timeout() || ne.Temporary())
}

// slotConn is an accepted connection holding a slot of the cap until it is closed.
type slotConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// NetConn returns the connection accepted, as tls.Conn.NetConn does.
func (c *slotConn) NetConn() net.Conn { return c.Conn }

// Close closes the underlying listener and both of the Splitter's listeners.
func (s *Splitter) Close() error {
	s.closeOnce.Do(func() { close(s.closed) })
	s.grpc.Close()
	s.http.Close()
	return s.ln.Close()
}

// sort reads c's first request and hands c to the listener serving it.
func (s *Splitter) sort(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(s.cfg.SniffTimeout))
	rec := &recorder{r: c}
	isH2, err := readPreface(rec)
	if err != nil {
		c.Close()
		return
	}
	if !isH2 {
		s.hand(s.http, c, rec.buf.Bytes(), false)
		return
	}
	// An empty SETTINGS frame: grpc-go clients wait for one before their first request.
	if _, err := c.Write([]byte{0, 0, 0, byte(http2.FrameSettings), 0, 0, 0, 0, 0}); err != nil {
		c.Close()
		return
	}
	grpc, err := s.firstRequestIsGRPC(rec)
	if err != nil && rec.buf.Len() == len(http2.ClientPreface) {
		c.Close() // nothing beyond the preface: the client went away or stayed silent
		return
	}
	if grpc {
		s.hand(s.grpc, c, rec.buf.Bytes(), false)
		return
	}
	s.hand(s.http, c, rec.buf.Bytes(), true)
}

// hand passes c, with the bytes already read from it, to l; dropAck removes the client's first
// SETTINGS acknowledgement (the one for the splitter's own frame).
func (s *Splitter) hand(l *listener, c net.Conn, read []byte, dropAck bool) {
	_ = c.SetReadDeadline(time.Time{})
	var r io.Reader = io.MultiReader(bytes.NewReader(read), c)
	if dropAck {
		r = &ackFilter{r: r, pass: len(http2.ClientPreface)}
	}
	select {
	case l.conns <- &conn{Conn: c, r: r}:
	case <-l.done:
		c.Close()
	}
}

// readPreface reports whether the connection starts with the HTTP/2 client preface. It reads
// only as far as the first byte that differs, so an HTTP/1 request shorter than the preface
// does not wait for more.
func readPreface(rec *recorder) (bool, error) {
	var b [64]byte
	for rec.buf.Len() < len(http2.ClientPreface) {
		n, err := rec.Read(b[:len(http2.ClientPreface)-rec.buf.Len()])
		if n > 0 && !strings.HasPrefix(http2.ClientPreface, rec.buf.String()) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
	}
	return true, nil
}

// firstRequestIsGRPC reads frames up to the first HEADERS frame and reports whether its
// content-type is gRPC's (and not gRPC-Web's).
func (s *Splitter) firstRequestIsGRPC(rec *recorder) (bool, error) {
	fr := http2.NewFramer(io.Discard, rec)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	for range s.cfg.MaxSniffFrames {
		f, err := fr.ReadFrame()
		if err != nil {
			return false, err
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			return isGRPC(f.PseudoValue("method"), f), nil
		case *http2.SettingsFrame, *http2.WindowUpdateFrame, *http2.PriorityFrame, *http2.PingFrame:
			continue
		}
		return false, nil
	}
	return false, nil
}

func isGRPC(method string, f *http2.MetaHeadersFrame) bool {
	if method != "POST" {
		return false
	}
	for _, hf := range f.RegularFields() {
		if hf.Name == "content-type" {
			ct := hf.Value
			rest, ok := strings.CutPrefix(ct, "application/grpc")
			return ok && (rest == "" || rest[0] == '+' || rest[0] == ';')
		}
	}
	return false
}

// recorder keeps every byte read through it.
type recorder struct {
	r   io.Reader
	buf bytes.Buffer
}

func (r *recorder) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.buf.Write(p[:n])
	return n, err
}

// ackFilter passes an HTTP/2 client's byte stream through, less the first SETTINGS frame with
// the ACK flag.
type ackFilter struct {
	r    io.Reader
	pass int  // bytes to pass before the next frame header (first the preface)
	done bool // the acknowledgement was removed: pass everything
	hdr  []byte
}

func (f *ackFilter) Read(p []byte) (int, error) {
	for {
		switch {
		case f.done:
			return f.r.Read(p)
		case len(f.hdr) > 0:
			n := copy(p, f.hdr)
			f.hdr = f.hdr[n:]
			return n, nil
		case f.pass > 0:
			n, err := f.r.Read(p[:min(len(p), f.pass)])
			f.pass -= n
			return n, err
		}
		var h [9]byte
		if _, err := io.ReadFull(f.r, h[:]); err != nil {
			return 0, err
		}
		length := int(h[0])<<16 | int(h[1])<<8 | int(h[2])
		if http2.FrameType(h[3]) == http2.FrameSettings && http2.Flags(h[4]).Has(http2.FlagSettingsAck) && length == 0 {
			f.done = true
			continue
		}
		f.hdr, f.pass = h[:], length
	}
}

// conn is a connection whose reads start with the bytes the splitter read.
type conn struct {
	net.Conn
	r io.Reader
}

func (c *conn) Read(p []byte) (int, error) { return c.r.Read(p) }

// NetConn returns the connection the splitter accepted, as tls.Conn.NetConn does.
func (c *conn) NetConn() net.Conn { return c.Conn }

// TLSState returns the TLS state of a connection the splitter handed on, once its handshake
// is done, or nil for a cleartext one: net/http and grpc-go do not see a *tls.Conn behind the
// splitter's own connection type.
func TLSState(c net.Conn) *tls.ConnectionState {
	for c != nil {
		if tc, ok := c.(*tls.Conn); ok {
			st := tc.ConnectionState()
			if !st.HandshakeComplete {
				return nil
			}
			return &st
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return nil
		}
		c = u.NetConn()
	}
	return nil
}

// listener is one side of a Splitter.
type listener struct {
	addr      net.Addr
	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
}

func newListener(addr net.Addr) *listener {
	return &listener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops this side's Accept; connections sorted to it afterwards are closed. The
// Splitter's own listener stays open until the Splitter's Close.
func (l *listener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return nil
}

func (l *listener) Addr() net.Addr { return l.addr }
