package client

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/quotaflow/quotaflow/internal/ratelimitheader"
	"github.com/quotaflow/quotaflow/internal/urlpath"
)

// HTTPConfig says how Middleware finds a request's subjects. A request with no subject at all
// is not checked.
type HTTPConfig struct {
	// User returns the request's user ("" for none), e.g. from the context an authentication
	// middleware filled.
	User func(*http.Request) string
	// IP returns the client's IP ("" for none): ClientIP(trusted) believes the forwarding
	// headers of trusted proxies only. Nil means no IP subject.
	IP func(*http.Request) string
	// APIKeyHeader names the header carrying an API key; empty means no API key subject.
	APIKeyHeader string
	// Endpoint returns what the rules' endpoint patterns match; nil means r.URL.EscapedPath(),
	// the path as the client wrote it, which the checker normalises (an encoded '/' or ';'
	// stays apart from a raw one, as ServeMux keeps them).
	Endpoint func(*http.Request) string
	// Cost returns the request's cost; nil means 1.
	Cost func(*http.Request) int64
	// DimensionHeaders name the headers of custom dimensions ({"tenant", "X-Tenant-Id"}): a
	// header present makes a Custom subject of its value, in this order.
	DimensionHeaders []DimensionHeader
}

// DimensionHeader is a custom dimension read from a request header.
type DimensionHeader struct {
	Dimension string // the custom dimension's name, as rules name it (dimension: tenant)
	Header    string
}

// Middleware checks each request before next serves it, after the wait a rule that delays
// instead of denying gave it (Decision.Delay). A denied request is answered 429 with
// Retry-After; every checked response carries the deciding limit as RateLimit and
// RateLimit-Policy (draft-ietf-httpapi-ratelimit-headers) and X-RateLimit-Limit, -Remaining and
// -Reset. A request whose path no limit can count (an encoded slash, a control character, ".."
// above the root: see the checker's endpoint normalisation) is answered 400, never let
// through unmetered. A check the checker refuses otherwise (a misconfigured subject) is logged
// and the request goes ahead: the limiter's own mistakes never turn into errors for the
// service's callers.
func (c *Client) Middleware(cfg HTTPConfig) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			req := cfg.request(r)
			if len(req.Subjects) == 0 {
				next.ServeHTTP(w, r)
				return
			}
			if _, err := urlpath.Normalize(req.Endpoint); err != nil {
				http.Error(w, fmt.Sprintf("Bad request: the path %v.", err), http.StatusBadRequest)
				return
			}
			d, err := c.Check(r.Context(), req)
			if err != nil {
				if r.Context().Err() != nil {
					return // the caller left
				}
				c.log.Error("rate limit check failed, request let through", "endpoint", req.Endpoint, "err", err)
				next.ServeHTTP(w, r)
				return
			}
			SetHeaders(w.Header(), d, time.Now())
			if !d.Allowed {
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				w.WriteHeader(http.StatusTooManyRequests)
				fmt.Fprintf(w, "Too many requests. Please retry after %d seconds.\n", ceilSeconds(d.RetryAfter))
				return
			}
			// The places in flight a concurrency rule gave the request go back once it is
			// served (or panicked), or when its caller leaves while it waits its slot.
			defer c.releaseAfter(&d)
			if d.Wait(r.Context()) != nil {
				return // the caller left
			}
			next.ServeHTTP(w, r)
		})
	}
}

func (cfg HTTPConfig) request(r *http.Request) Request {
	req := Request{Endpoint: r.URL.EscapedPath()}
	if cfg.Endpoint != nil {
		req.Endpoint = cfg.Endpoint(r)
	}
	if cfg.Cost != nil {
		req.Cost = cfg.Cost(r)
	}
	add := func(d Dimension, id string) {
		if id != "" {
			req.Subjects = append(req.Subjects, Subject{Dimension: d, ID: id})
		}
	}
	if cfg.User != nil {
		add(User, cfg.User(r))
	}
	if cfg.IP != nil {
		add(IP, cfg.IP(r))
	}
	if cfg.APIKeyHeader != "" {
		add(APIKey, r.Header.Get(cfg.APIKeyHeader))
	}
	for _, d := range cfg.DimensionHeaders {
		if v := r.Header.Get(d.Header); v != "" {
			req.Subjects = append(req.Subjects, Custom(d.Dimension, v))
		}
	}
	return req
}

// SetHeaders sets the rate limit fields of d on h: RateLimit and RateLimit-Policy
// (draft-ietf-httpapi-ratelimit-headers-11), X-RateLimit-Limit, -Remaining and -Reset (unix
// seconds), and Retry-After (whole seconds, rounded up) when denied. A fail-mode decision has
// no limit of the checker's: it sets Retry-After only, and X-RateLimit-Degraded.
func SetHeaders(h http.Header, d Decision, now time.Time) {
	if !d.Allowed {
		h.Set("Retry-After", strconv.FormatInt(ceilSeconds(d.RetryAfter), 10))
	}
	if d.Degraded {
		h.Set("X-RateLimit-Degraded", "true")
	}
	if d.RuleID == "" {
		return
	}
	h.Set("X-RateLimit-Limit", strconv.FormatInt(d.Limit, 10))
	h.Set("X-RateLimit-Remaining", strconv.FormatInt(max(0, d.Remaining), 10))
	reset := int64(0)
	if !d.ResetAt.IsZero() {
		h.Set("X-RateLimit-Reset", strconv.FormatInt(d.ResetAt.Unix(), 10))
		reset = max(0, ceilSeconds(d.ResetAt.Sub(now)))
	}
	h.Set("RateLimit", ratelimitheader.Limit(d.RuleID, d.Remaining, reset))
	var ps ratelimitheader.Policies
	for _, p := range d.Policies {
		ps.Add(p.RuleID, p.Limit, p.Window, p.Burst)
	}
	if v := ps.String(); v != "" {
		h.Set("RateLimit-Policy", v)
	}
}

func ceilSeconds(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }

// ClientIP returns an IP extractor for HTTPConfig.IP that believes X-Forwarded-For only from
// trusted proxies: the client is the connection's peer unless that peer is trusted, then the
// rightmost address of X-Forwarded-For that is not a trusted proxy (a client can prepend any
// address it likes, never append one).
func ClientIP(trusted []netip.Prefix) func(*http.Request) string {
	isTrusted := func(a netip.Addr) bool {
		for _, p := range trusted {
			if p.Contains(a.Unmap()) {
				return true
			}
		}
		return false
	}
	return func(r *http.Request) string {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			host = r.RemoteAddr
		}
		peer, err := netip.ParseAddr(host)
		if err != nil {
			slog.Debug("quotaflow client: unparseable remote address", "remote_addr", r.RemoteAddr)
			return ""
		}
		client := peer.Unmap()
		if !isTrusted(client) {
			return client.String()
		}
		hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
		for i := len(hops) - 1; i >= 0; i-- {
			a, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
			if err != nil {
				break // a forged or broken hop: believe nothing left of it
			}
			client = a.Unmap()
			if !isTrusted(client) {
				break
			}
		}
		return client.String()
	}
}
