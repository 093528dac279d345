package webhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// URLPolicy is where the operator lets webhooks go. An endpoint's URL is supplied by whoever
// registers it, so without a policy it could aim quotaflow's POSTs at the machine's own
// loopback ports, the cloud's metadata service (169.254.169.254) or the private network behind
// the firewall. By default only public addresses are reached; the policy is checked when an
// endpoint is validated and again on every connection (Client), since a name that resolved to
// a public address then may resolve to a private one now (DNS rebinding).
type URLPolicy struct {
	// AllowHosts are hosts ("hooks.internal", "10.1.2.3") or host:port pairs
	// ("localhost:8080", "[::1]:9000") reached whatever they are or resolve to.
	AllowHosts []string
	// AllowPrivate lets URLs reach private addresses (10/8, 172.16/12, 192.168/16, 100.64/10,
	// fc00::/7). Loopback, link-local (the metadata service), multicast and unspecified
	// addresses are still refused: only AllowHosts reaches those.
	AllowPrivate bool
}

// ErrRefusedAddress is wrapped by the error of a connection that the URL policy refused.
var ErrRefusedAddress = errors.New("address refused by the webhook URL policy")

// addrRange is a range of addresses and what to call them in an error.
type addrRange struct {
	prefix netip.Prefix
	kind   string
}

// reserved are the address ranges refused by default.
var reserved = []addrRange{
	{netip.MustParsePrefix("0.0.0.0/8"), "unspecified"}, // "this network": the local host on Linux
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private"},
	{netip.MustParsePrefix("100.64.0.0/10"), "private"}, // carrier-grade NAT, as private as the others
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"}, // with the broadcast address
	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("fc00::/7"), "private"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
}

// nat64 is the well-known NAT64 prefix, whose addresses reach the IPv4 address in their last
// four bytes: they are judged as that address.
var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// kind is what ip is: "loopback", "private", "link-local", "multicast", "unspecified",
// "reserved", or "" for a public address.
func kind(ip netip.Addr) string {
	ip = ip.WithZone("").Unmap()
	if nat64.Contains(ip) {
		b := ip.As16()
		ip = netip.AddrFrom4([4]byte(b[12:]))
	}
	for _, r := range reserved {
		if r.prefix.Contains(ip) {
			return r.kind
		}
	}
	return ""
}

// refuses returns what ip is when the policy refuses it, or "".
func (p URLPolicy) refuses(ip netip.Addr) string {
	k := kind(ip)
	if k == "private" && p.AllowPrivate {
		return ""
	}
	return k
}

// allows reports whether host (a name or an IP, without brackets) on port is in AllowHosts.
func (p URLPolicy) allows(host, port string) bool {
	host = normalHost(host)
	for _, entry := range p.AllowHosts {
		h, pt, err := net.SplitHostPort(entry)
		if err != nil {
			h, pt = strings.Trim(entry, "[]"), ""
		}
		if normalHost(h) == host && (pt == "" || pt == port) {
			return true
		}
	}
	return false
}

// normalHost is host as AllowHosts entries are compared: lower case without a final dot, an
// IP in its canonical form.
func normalHost(host string) string {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip.Unmap().String()
	}
	return host
}

// checkURL reports why the policy refuses raw, or nil; with resolve, a name must resolve and
// all its addresses be allowed.
func (p URLPolicy) checkURL(raw string, resolve bool) error {
	if raw == "" {
		return errors.New("required")
	}
	if len(raw) > maxURLBytes {
		return fmt.Errorf("must be at most %d bytes, got %d", maxURLBytes, len(raw))
	}
	u, err := url.Parse(raw)
	if err != nil {
		// Not url.Error's own message, which repeats the URL.
		if ue := (*url.Error)(nil); errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("not a URL: %w", err)
	}
	host, port, err := target(u)
	if err != nil || p.allows(host, port) {
		return err
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if k := p.refuses(ip); k != "" {
			return fmt.Errorf("host %s is a %s address, which the URL policy does not allow", host, k)
		}
		return nil
	}
	if err := p.checkName(host); err != nil || !resolve {
		return err
	}
	return p.checkResolved(host)
}

// maxURLBytes bounds an endpoint URL: longer ones are no endpoint anyone types.
const maxURLBytes = 2048

// target is u's host and port (the scheme's default when none) after the checks that need no
// policy: http or https, no user info, a host without a zone, a port in range.
func target(u *url.URL) (host, port string, err error) {
	scheme := strings.ToLower(u.Scheme)
	switch {
	case scheme != "http" && scheme != "https":
		return "", "", fmt.Errorf("scheme %q: want http or https", u.Scheme)
	case u.Opaque != "":
		return "", "", errors.New("want scheme://host/path")
	case u.User != nil:
		return "", "", errors.New("must not hold user info: the receiver authenticates the signature instead, and user info ends up in logs")
	case u.Hostname() == "":
		return "", "", errors.New("has no host")
	case strings.Contains(u.Hostname(), "%"):
		return "", "", errors.New("must not hold an IPv6 zone")
	}
	port = u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[scheme]
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", "", fmt.Errorf("port %q: want 1 to 65535", port)
	}
	return u.Hostname(), port, nil
}

// checkName refuses the names that need no DNS to be judged: localhost (RFC 6761 reserves it
// and its subdomains for the loopback) and numbers that some resolvers read as IPv4 addresses
// ("2130706433", "127.1", "0x7f.1"), which no name is: no top-level domain starts with a digit.
func (p URLPolicy) checkName(host string) error {
	name := normalHost(host)
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return fmt.Errorf("host %s is a loopback name, which the URL policy does not allow", host)
	}
	if tld := name[strings.LastIndexByte(name, '.')+1:]; tld == "" || tld[0] >= '0' && tld[0] <= '9' {
		return fmt.Errorf("host %s: neither a name nor an IP address as four decimal numbers", host)
	}
	return nil
}

// resolveTimeout bounds the DNS lookup of a validation.
const resolveTimeout = 5 * time.Second

// checkResolved resolves host and refuses it when any of its addresses is refused: a name
// with one private address among public ones reaches it on some connections.
func (p URLPolicy) checkResolved(host string) error {
	ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return fmt.Errorf("host %s does not resolve: %w", host, err)
	}
	for _, ip := range addrs {
		if k := p.refuses(ip); k != "" {
			return fmt.Errorf("host %s resolves to %s, a %s address, which the URL policy does not allow", host, ip, k)
		}
	}
	return nil
}

// Client returns an HTTP client that delivers under the policy: every connection's address is
// checked as it is dialled, after DNS, so that a name rebound to a private address since its
// validation is refused (the AllowHosts pass as they are); it follows no redirect (a 3xx is an
// answer: following it would send the signed body where nobody registered) and uses no proxy
// (through one, the dialled address would be the proxy's and the check moot).
func (p URLPolicy) Client() *http.Client {
	checked := &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second, Control: p.control}
	plain := &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if host, port, err := net.SplitHostPort(addr); err == nil && p.allows(host, port) {
				return plain.DialContext(ctx, network, addr)
			}
			return checked.DialContext(ctx, network, addr)
		},
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           100,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    dialTimeout,
		MaxResponseHeaderBytes: 64 << 10,
	}
	return &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// dialTimeout bounds a connection's dial and TLS handshake, within the attempt's timeout.
const dialTimeout = 5 * time.Second

// control is the checked dialer's net.Dialer.Control: it refuses an address the policy
// refuses before the connection is made.
func (p URLPolicy) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s is not an IP address and port", ErrRefusedAddress, address)
	}
	if k := p.refuses(ap.Addr()); k != "" {
		return fmt.Errorf("%w: %s is a %s address", ErrRefusedAddress, ap.Addr(), k)
	}
	return nil
}
