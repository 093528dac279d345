package auth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/quotaflow/quotaflow/checker"
)

// A Lockout counts failed authentications per source address, in one token bucket per address
// in the checkers' shared store, for the admin API and every protocol of the check API alike:
// otherwise a token could be guessed through whichever door counts nothing. Past the limit, a
// source's credentials are refused (429, ResourceExhausted) before they are looked at — the
// right ones included, so that a guess past the limit tells nothing.
//
// The admin API asks the store on every call (Check). The check API cannot afford a round trip
// per check, so it refuses the sources this process knows to be locked out (Known): those whose
// failure it counted when their bucket was, or became, empty. A locked-out source thus gets at
// most one more answered guess per checker process per lockout.

// DefaultFailuresPerMinute is the failed authentications allowed per source and minute when
// LockoutConfig leaves it 0.
const DefaultFailuresPerMinute = 10

// Buckets keeps the failure counts: *checker.Engine.
type Buckets interface {
	Take(ctx context.Context, a checker.Allowance) (checker.LimitResult, error)
	Left(ctx context.Context, a checker.Allowance) (checker.LimitResult, error)
}

// LockoutConfig configures a Lockout. The zero value allows DefaultFailuresPerMinute per
// connection address.
type LockoutConfig struct {
	// FailuresPerMinute is the failed authentications allowed per source address and minute;
	// 0 means DefaultFailuresPerMinute.
	FailuresPerMinute int
	// TrustedProxies are the proxies whose forwarded headers name the source (as forward-auth
	// believes them for the client IP); from any other peer the source is the connection's
	// address, whatever the headers say, so that no client can spend another's failures.
	TrustedProxies []netip.Prefix
	// Logger receives the failures and lockouts, with "component"="auth"; nil means
	// slog.Default().
	Logger *slog.Logger
}

// ErrLockedOut is wrapped by the error of a call refused for its source's failures.
var ErrLockedOut = errors.New("too many failed authentications")

// LockedOutError is a call refused because its source address failed to authenticate too
// often; it wraps ErrLockedOut.
type LockedOutError struct {
	Source     string
	PerMinute  int64
	RetryAfter time.Duration
}

// Error implements error.
func (e *LockedOutError) Error() string {
	return fmt.Sprintf("%v from %s (more than %d per minute); retry after %s",
		ErrLockedOut, e.Source, e.PerMinute, e.RetryAfter.Round(time.Millisecond))
}

// Unwrap returns ErrLockedOut.
func (e *LockedOutError) Unwrap() error { return ErrLockedOut }

// Lockout counts failed authentications; its methods are safe for concurrent use.
type Lockout struct {
	buckets   Buckets
	perMinute int64
	trusted   []netip.Prefix
	log       *slog.Logger

	mu     sync.Mutex
	locked map[string]time.Time // source → until when it is known locked out
}

// maxKnown bounds the locked-out sources a process remembers: beyond it, those whose lockout
// ended go first, then any (the store still counts them).
const maxKnown = 1 << 16

// NewLockout returns a Lockout keeping its counts in b.
func NewLockout(b Buckets, cfg LockoutConfig) *Lockout {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	l := &Lockout{buckets: b, perMinute: int64(cfg.FailuresPerMinute), trusted: cfg.TrustedProxies,
		log: log.With("component", "auth"), locked: map[string]time.Time{}}
	if l.perMinute <= 0 {
		l.perMinute = DefaultFailuresPerMinute
	}
	return l
}

// FailuresPerMinute is the failed authentications allowed per source and minute.
func (l *Lockout) FailuresPerMinute() int64 { return l.perMinute }

// Source is the source address of a call from remoteAddr ("host:port"), whose headers header
// reads (nil for none): see ClientAddr. IPv6 sources are their /64, as ip rules count them by
// default: a client owns a whole /64, and would otherwise have 2^64 lockouts to spend. A
// remote address that is no IP address (a pipe) is its own source.
func (l *Lockout) Source(remoteAddr string, header func(name string) []string) string {
	peer, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return remoteAddr
	}
	a := ClientAddr(peer.Addr(), l.trusted, header)
	if a.Is6() {
		if p, err := a.Prefix(64); err == nil {
			return p.String()
		}
	}
	return a.String()
}

func (l *Lockout) allowance(src string) checker.Allowance {
	return checker.Allowance{Namespace: "adminauth", ID: src, Name: "failures", PerMinute: l.perMinute}
}

// Known returns a *LockedOutError when this process knows src to be locked out; it asks no
// store.
func (l *Lockout) Known(src string) error {
	l.mu.Lock()
	until, ok := l.locked[src]
	l.mu.Unlock()
	if d := time.Until(until); ok && d > 0 {
		return &LockedOutError{Source: src, PerMinute: l.perMinute, RetryAfter: d}
	}
	return nil
}

// Check returns a *LockedOutError when src has no failed authentication left, asking the store
// unless this process already knows. A store that cannot answer locks nobody out: the
// credentials are still checked.
func (l *Lockout) Check(ctx context.Context, src string) error {
	if err := l.Known(src); err != nil {
		return err
	}
	res, err := l.buckets.Left(ctx, l.allowance(src))
	if err != nil || res.Allowed {
		return nil
	}
	return l.lock(src, res.RetryAfter)
}

// Fail counts a failed authentication of src, whose cause is logged. It returns a
// *LockedOutError when src had no failure left, so that the call is answered as locked out
// rather than as a wrong guess.
func (l *Lockout) Fail(ctx context.Context, src string, cause error) error {
	l.log.Warn("authentication failed", "source", src, "err", cause)
	res, err := l.buckets.Take(ctx, l.allowance(src))
	switch {
	case err != nil:
		l.log.Warn("failed authentication not counted", "source", src, "err", err)
		return nil
	case !res.Allowed:
		return l.lock(src, res.RetryAfter)
	case res.Remaining == 0:
		// That was the last: the next call is refused. A bucket refills one failure per
		// minute/FailuresPerMinute, so that is how long the source stays known locked out.
		l.lock(src, time.Minute/time.Duration(l.perMinute))
	}
	return nil
}

// lock remembers that src is locked out for d, logs it, and returns its error.
func (l *Lockout) lock(src string, d time.Duration) error {
	until := time.Now().Add(d)
	l.mu.Lock()
	prev, known := l.locked[src]
	if !known && len(l.locked) >= maxKnown {
		l.forget()
	}
	l.locked[src] = until
	l.mu.Unlock()
	if !known || time.Until(prev) <= 0 {
		l.log.Warn("source locked out: too many failed authentications", "source", src,
			"failures_per_minute", l.perMinute, "retry_after", d.Round(time.Millisecond))
	}
	return &LockedOutError{Source: src, PerMinute: l.perMinute, RetryAfter: d}
}

// forget makes room in locked: the sources whose lockout ended, else one at random. l.mu is
// held.
func (l *Lockout) forget() {
	now := time.Now()
	for src, until := range l.locked {
		if until.Before(now) {
			delete(l.locked, src)
		}
	}
	if len(l.locked) < maxKnown {
		return
	}
	for src := range l.locked {
		delete(l.locked, src)
		return
	}
}

// ClientAddr is the address a call comes from: peer, the connection's, unless peer is in
// trusted; a trusted proxy's forwarded headers then name it — X-Forwarded-For walked from the
// right past the trusted proxies (stopping at the first hop that is not one, or is no address),
// else X-Real-Ip, else X-Client-Ip. header reads a request header's values (nil: none). The
// address is unmapped (::ffff:192.0.2.1 is 192.0.2.1) and keeps no zone.
func ClientAddr(peer netip.Addr, trusted []netip.Prefix, header func(name string) []string) netip.Addr {
	ip := peer.Unmap().WithZone("")
	if header == nil || !isTrusted(trusted, ip) {
		return ip
	}
	if xff := header("X-Forwarded-For"); len(xff) > 0 {
		hops := strings.Split(strings.Join(xff, ","), ",")
		for i := len(hops) - 1; i >= 0; i-- {
			hop, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
			if err != nil {
				break // garbage a client wrote: the last address believed stands
			}
			ip = hop.Unmap().WithZone("")
			if !isTrusted(trusted, ip) {
				break
			}
		}
		return ip
	}
	for _, name := range []string{"X-Real-Ip", "X-Client-Ip"} {
		if vs := header(name); len(vs) > 0 {
			if v, err := netip.ParseAddr(strings.TrimSpace(vs[0])); err == nil {
				return v.Unmap().WithZone("")
			}
		}
	}
	return ip
}

func isTrusted(trusted []netip.Prefix, ip netip.Addr) bool {
	for _, p := range trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}
