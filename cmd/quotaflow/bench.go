package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	rlcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	quotaflowv1 "github.com/quotaflow/quotaflow/proto/quotaflow/v1"
	"github.com/quotaflow/quotaflow/proto/quotaflow/v1/quotaflowv1connect"
)

// Bounds on bench's settings.
const (
	benchMaxKeys        = 1_000_000 // identifiers are made up front
	benchMaxConcurrency = 10_000
	benchErrorSamples   = 3
	// benchErrorPause is how long a closed-loop worker waits after an error, so that a target
	// that refuses connections does not turn the generator into a busy loop.
	benchErrorPause = 10 * time.Millisecond
)

// benchOptions are bench's flags.
type benchOptions struct {
	target, protocol, distribution, endpoint, dimension, keyPrefix, domain string
	concurrency, keys                                                      int
	rate                                                                   float64
	duration, warmup, timeout                                              time.Duration
	json                                                                   bool
}

func runBench(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench", `Puts load on a checker and reports throughput and latency: checks/s, p50, p90, p99 and
p99.9, allowed, denied and errors. Without --rate it is a closed loop (--concurrency workers,
each sending its next check as soon as the last is answered); with --rate an open loop (checks
start on a fixed schedule whatever the answers, and latency counts from each check's scheduled
time, so a target that falls behind shows as latency instead of being hidden). Progress is
printed to stderr every second; the report goes to stdout.`, stderr)
	var o benchOptions
	fs.StringVar(&o.target, "target", "http://127.0.0.1:8080", "checker base `URL`")
	fs.fromEnv("target", "QUOTAFLOW_TARGET")
	fs.StringVar(&o.protocol, "protocol", "connect", "`protocol`: connect (CheckRateLimit over Connect, HTTP/1.1), grpc (CheckRateLimit over gRPC, HTTP/2) or rls (Envoy's ShouldRateLimit over gRPC)")
	fs.IntVar(&o.concurrency, "concurrency", 64, "closed loop: `N` workers; open loop: at most N checks in flight")
	fs.Float64Var(&o.rate, "rate", 0, "open loop at `R` checks per second in total (0: closed loop)")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "how long to measure")
	fs.DurationVar(&o.warmup, "warmup", 0, "load to send before measuring, not counted in the report")
	fs.IntVar(&o.keys, "keys", 10000, fmt.Sprintf("number of distinct subjects (at most %d)", benchMaxKeys))
	fs.StringVar(&o.distribution, "distribution", "uniform", "how checks pick their subject, a `distribution`: uniform; zipf (Zipf s=1.1: subject n is picked in proportion to 1/(n+1)^1.1); hot (90% of checks go to 1% of the subjects)")
	fs.StringVar(&o.endpoint, "endpoint", "/api/v1/orders", "`path` every check names as its endpoint")
	fs.StringVar(&o.dimension, "dimension", "user", "`dimension` of the subjects: user, ip or apikey")
	fs.StringVar(&o.keyPrefix, "key-prefix", "bench-", "subject identifiers are this `prefix` and a number")
	fs.StringVar(&o.domain, "domain", "quotaflow", "RLS `domain` (--protocol rls)")
	fs.DurationVar(&o.timeout, "timeout", 2*time.Second, "deadline of each check; one that misses it counts as an error")
	fs.BoolVar(&o.json, "json", false, "print the report as one JSON object (checks_per_sec, p50_ms, p90_ms, p99_ms, p999_ms, allowed, denied, errors and more)")
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	if err := o.validate(); err != nil {
		return usageError{err}
	}
	call, closeTarget, err := newBenchTarget(&o)
	if err != nil {
		return err
	}
	defer closeTarget()
	rep := benchRun(ctx, &o, call, stderr)
	if o.json {
		enc := json.NewEncoder(stdout)
		return enc.Encode(rep)
	}
	rep.print(stdout, &o)
	return nil
}

func (o *benchOptions) validate() error {
	switch {
	case o.protocol != "connect" && o.protocol != "grpc" && o.protocol != "rls":
		return fmt.Errorf("--protocol: want connect, grpc or rls, got %q", o.protocol)
	case o.concurrency < 1 || o.concurrency > benchMaxConcurrency:
		return fmt.Errorf("--concurrency: want 1 to %d, got %d", benchMaxConcurrency, o.concurrency)
	case o.rate < 0 || math.IsNaN(o.rate) || math.IsInf(o.rate, 0):
		return fmt.Errorf("--rate: want a positive number of checks per second (or 0 for a closed loop), got %v", o.rate)
	case o.duration <= 0:
		return fmt.Errorf("--duration: want more than 0, got %s", o.duration)
	case o.warmup < 0:
		return fmt.Errorf("--warmup: want 0 or more, got %s", o.warmup)
	case o.timeout <= 0:
		return fmt.Errorf("--timeout: want more than 0, got %s", o.timeout)
	case o.keys < 1 || o.keys > benchMaxKeys:
		return fmt.Errorf("--keys: want 1 to %d, got %d", benchMaxKeys, o.keys)
	case !strings.HasPrefix(o.endpoint, "/"):
		return fmt.Errorf("--endpoint: want a path starting with /, got %q", o.endpoint)
	}
	if _, err := newKeyPicker(o.distribution, o.keys, 0); err != nil {
		return err
	}
	if _, ok := benchDimensions[o.dimension]; !ok {
		return fmt.Errorf("--dimension: want user, ip or apikey, got %q", o.dimension)
	}
	u, err := url.Parse(o.target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("--target: want an http:// or https:// URL, got %q", o.target)
	}
	return nil
}

// benchDimensions maps --dimension to the RPC's dimension and the RLS descriptor key.
var benchDimensions = map[string]struct {
	dim    quotaflowv1.Dimension
	rlsKey string
}{
	"user":   {quotaflowv1.Dimension_DIMENSION_USER, "user_id"},
	"ip":     {quotaflowv1.Dimension_DIMENSION_IP, "remote_address"},
	"apikey": {quotaflowv1.Dimension_DIMENSION_API_KEY, "api_key"},
}

// benchCall sends one check for subject id; it reports whether it was allowed. Each worker
// gets its own, so that it may reuse its request.
type benchCall func(ctx context.Context, id string) (allowed bool, err error)

// newBenchTarget returns a maker of per-worker calls for o's protocol and a function releasing
// the connections.
func newBenchTarget(o *benchOptions) (func() benchCall, func(), error) {
	u, _ := url.Parse(o.target)
	base := strings.TrimSuffix(o.target, "/")
	dim := benchDimensions[o.dimension]
	if o.protocol == "connect" {
		tr := &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: o.timeout, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        o.concurrency,
			MaxIdleConnsPerHost: o.concurrency,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
			Protocols:           new(http.Protocols),
		}
		tr.Protocols.SetHTTP1(true)
		// Responses are not compressed: the generator and the checker share the CPU, and
		// gateways do not compress these small messages either.
		client := quotaflowv1connect.NewRateLimiterClient(&http.Client{Transport: tr}, base,
			connect.WithAcceptCompression("gzip", nil, nil))
		return func() benchCall {
			msg := &quotaflowv1.CheckRateLimitRequest{Dimension: dim.dim, Endpoint: o.endpoint}
			return func(ctx context.Context, id string) (bool, error) {
				msg.Identifier = id
				resp, err := client.CheckRateLimit(ctx, connect.NewRequest(msg))
				if err != nil {
					return false, err
				}
				return resp.Msg.Allowed, nil
			}
		}, tr.CloseIdleConnections, nil
	}
	// grpc and rls: grpc-go clients on one HTTP/2 connection, as Envoy and gRPC services call.
	host := u.Host
	if u.Port() == "" {
		port := "80"
		if u.Scheme == "https" {
			port = "443"
		}
		host = net.JoinHostPort(u.Hostname(), port)
	}
	creds := insecure.NewCredentials()
	if u.Scheme == "https" {
		creds = credentials.NewTLS(&tls.Config{ServerName: u.Hostname()})
	}
	conn, err := grpc.NewClient(host, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, nil, usageError{fmt.Errorf("--target: %w", err)}
	}
	if o.protocol == "grpc" {
		client := quotaflowv1.NewRateLimiterClient(conn)
		return func() benchCall {
			msg := &quotaflowv1.CheckRateLimitRequest{Dimension: dim.dim, Endpoint: o.endpoint}
			return func(ctx context.Context, id string) (bool, error) {
				msg.Identifier = id
				resp, err := client.CheckRateLimit(ctx, msg)
				if err != nil {
					return false, err
				}
				return resp.Allowed, nil
			}
		}, func() { conn.Close() }, nil
	}
	client := ratelimitv3.NewRateLimitServiceClient(conn)
	return func() benchCall {
		subject := &rlcommonv3.RateLimitDescriptor_Entry{Key: dim.rlsKey}
		req := &ratelimitv3.RateLimitRequest{Domain: o.domain, Descriptors: []*rlcommonv3.RateLimitDescriptor{{
			Entries: []*rlcommonv3.RateLimitDescriptor_Entry{subject, {Key: "path", Value: o.endpoint}},
		}}}
		return func(ctx context.Context, id string) (bool, error) {
			subject.Value = id
			resp, err := client.ShouldRateLimit(ctx, req)
			if err != nil {
				return false, err
			}
			switch resp.OverallCode {
			case ratelimitv3.RateLimitResponse_OK:
				return true, nil
			case ratelimitv3.RateLimitResponse_OVER_LIMIT:
				return false, nil
			}
			return false, fmt.Errorf("ShouldRateLimit: overall code %s", resp.OverallCode)
		}
	}, func() { conn.Close() }, nil
}

// benchStats are the counts of one phase (warm-up or measurement).
type benchStats struct {
	hist                    histogram // latency of answered checks, µs
	allowed, denied, errors atomic.Uint64

	mu      sync.Mutex
	samples []string // the first distinct error messages
}

func (s *benchStats) done(allowed bool, err error, latency time.Duration) {
	switch {
	case err != nil:
		s.errors.Add(1)
		msg := err.Error()
		s.mu.Lock()
		if len(s.samples) < benchErrorSamples && !containsString(s.samples, msg) {
			s.samples = append(s.samples, msg)
		}
		s.mu.Unlock()
		return
	case allowed:
		s.allowed.Add(1)
	default:
		s.denied.Add(1)
	}
	s.hist.record(latency)
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// benchReport is the result of a run. The JSON keys checks_per_sec, p50_ms, p90_ms, p99_ms,
// p999_ms, allowed, denied and errors are a stable interface for scripts.
type benchReport struct {
	Protocol     string   `json:"protocol"`
	Mode         string   `json:"mode"` // closed or open
	Concurrency  int      `json:"concurrency"`
	Rate         float64  `json:"rate"`
	Keys         int      `json:"keys"`
	Distribution string   `json:"distribution"`
	DurationS    float64  `json:"duration_s"` // measured time
	Checks       uint64   `json:"checks"`     // allowed + denied + errors
	ChecksPerSec float64  `json:"checks_per_sec"`
	P50Ms        float64  `json:"p50_ms"`
	P90Ms        float64  `json:"p90_ms"`
	P99Ms        float64  `json:"p99_ms"`
	P999Ms       float64  `json:"p999_ms"`
	MaxMs        float64  `json:"max_ms"`
	MeanMs       float64  `json:"mean_ms"`
	Allowed      uint64   `json:"allowed"`
	Denied       uint64   `json:"denied"`
	Errors       uint64   `json:"errors"`
	Missed       uint64   `json:"missed"` // open loop: scheduled checks never sent
	Interrupted  bool     `json:"interrupted,omitempty"`
	ErrorSamples []string `json:"error_samples,omitempty"`
}

// benchRun puts the load on and returns what was measured. It returns at the end of
// o.warmup+o.duration, once the checks in flight are answered (each is bounded by o.timeout),
// or as soon as ctx is done.
func benchRun(ctx context.Context, o *benchOptions, newCall func() benchCall, stderr io.Writer) *benchReport {
	ids := make([]string, o.keys)
	for i := range ids {
		ids[i] = o.keyPrefix + strconv.Itoa(i)
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	warm, measured := &benchStats{}, &benchStats{}
	start := time.Now()
	measureFrom := start.Add(o.warmup)
	end := measureFrom.Add(o.duration)
	var (
		sent    atomic.Int64 // open loop: measured slots sent
		workers sync.WaitGroup
		slots   chan time.Time // open loop: due times, from pace
	)
	interval := 0.0
	if o.rate > 0 {
		interval = float64(time.Second) / o.rate
		slots = make(chan time.Time, o.concurrency)
		go pace(runCtx, start, end, interval, slots)
	}
	seed := uint64(time.Now().UnixNano())
	for w := 0; w < o.concurrency; w++ {
		workers.Add(1)
		call := newCall()
		picker, _ := newKeyPicker(o.distribution, o.keys, seed+uint64(w))
		go func() {
			defer workers.Done()
			for {
				var from time.Time // what latency counts from
				if slots != nil {
					at, ok := <-slots
					if !ok {
						return
					}
					from = at
				} else if from = time.Now(); !from.Before(end) || runCtx.Err() != nil {
					return
				}
				stats := measured
				if from.Before(measureFrom) {
					stats = warm
				} else if slots != nil {
					sent.Add(1)
				}
				cctx, ccancel := context.WithTimeout(runCtx, o.timeout)
				allowed, err := call(cctx, ids[picker.next()])
				ccancel()
				if err != nil && ctx.Err() != nil {
					return // interrupted: not the target's error
				}
				stats.done(allowed, err, time.Since(from))
				if err != nil && slots == nil && !sleepCtx(runCtx, benchErrorPause) {
					return
				}
			}
		}()
	}
	stopProgress := startProgress(stderr, start, measureFrom, warm, measured)
	workers.Wait()
	finished := time.Now()
	stopProgress()

	rep := &benchReport{
		Protocol: o.protocol, Mode: "closed", Concurrency: o.concurrency, Rate: o.rate, Keys: o.keys,
		Distribution: o.distribution, Interrupted: ctx.Err() != nil,
		Allowed: measured.allowed.Load(), Denied: measured.denied.Load(), Errors: measured.errors.Load(),
		ErrorSamples: measured.samples,
	}
	rep.Checks = rep.Allowed + rep.Denied + rep.Errors
	if elapsed := finished.Sub(measureFrom); elapsed > 0 {
		rep.DurationS = round3(elapsed.Seconds())
		rep.ChecksPerSec = round3(float64(rep.Allowed+rep.Denied) / elapsed.Seconds())
	}
	if o.rate > 0 {
		rep.Mode = "open"
		if due := slotsBefore(start, end, interval) - slotsBefore(start, measureFrom, interval); !rep.Interrupted && due > sent.Load() {
			rep.Missed = uint64(due - sent.Load())
		}
	}
	h := &measured.hist
	rep.P50Ms, rep.P90Ms, rep.P99Ms, rep.P999Ms = h.quantileMs(0.5), h.quantileMs(0.9), h.quantileMs(0.99), h.quantileMs(0.999)
	rep.MaxMs, rep.MeanMs = round3(float64(h.max.Load())/1000), h.meanMs()
	return rep
}

// sleepCtx sleeps for d; it reports false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// slotTime is when the open loop's check number k is due.
func slotTime(start time.Time, k int64, interval float64) time.Time {
	return start.Add(time.Duration(float64(k) * interval))
}

// slotsBefore is the number of the open loop's checks due before t.
func slotsBefore(start, t time.Time, interval float64) int64 {
	k := int64(math.Ceil(float64(t.Sub(start)) / interval))
	for k > 0 && !slotTime(start, k-1, interval).Before(t) {
		k--
	}
	for slotTime(start, k, interval).Before(t) {
		k++
	}
	return k
}

func round3(f float64) float64 { return math.Round(f*1000) / 1000 }

// startProgress prints a line to w every second, over the same line when w is a terminal. The
// returned function stops it and ends the line.
func startProgress(w io.Writer, start, measureFrom time.Time, warm, measured *benchStats) func() {
	tty := isTerminal(w)
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		var last uint64
		var lastPhase *benchStats
		printed := false
		for {
			select {
			case <-done:
				if printed && tty {
					fmt.Fprintln(w)
				}
				return
			case now := <-t.C:
				// The phase is the one the most of the last second was in.
				phase, label := measured, "bench "
				if now.Add(-time.Second / 2).Before(measureFrom) {
					phase, label = warm, "warmup"
				}
				if phase != lastPhase {
					last, lastPhase = 0, phase
				}
				answered := phase.allowed.Load() + phase.denied.Load()
				line := fmt.Sprintf("%s %4.0fs  %8d checks/s  p99 %7.3fms  errors %d",
					label, now.Sub(start).Seconds(), answered-last, phase.hist.quantileMs(0.99), phase.errors.Load())
				last = answered
				if tty {
					fmt.Fprintf(w, "\r%s\x1b[K", line)
				} else {
					fmt.Fprintln(w, line)
				}
				printed = true
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
	}
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func (r *benchReport) print(w io.Writer, o *benchOptions) {
	mode := fmt.Sprintf("closed loop with %d workers", r.Concurrency)
	if r.Mode == "open" {
		mode = fmt.Sprintf("open loop at %g checks/s, at most %d in flight", r.Rate, r.Concurrency)
	}
	fmt.Fprintf(w, "quotaflow bench: %s to %s for %s, %s\n", o.protocol, o.target, o.duration, mode)
	fmt.Fprintf(w, "  %d %s subjects (%s) on %s\n", r.Keys, o.dimension, r.Distribution, o.endpoint)
	if r.Interrupted {
		fmt.Fprintf(w, "  interrupted after %.3fs\n", r.DurationS)
	}
	fmt.Fprintf(w, "checks/s    %.1f  (%d checks in %.3fs)\n", r.ChecksPerSec, r.Checks, r.DurationS)
	fmt.Fprintf(w, "latency ms  p50 %.3f  p90 %.3f  p99 %.3f  p99.9 %.3f  max %.3f\n", r.P50Ms, r.P90Ms, r.P99Ms, r.P999Ms, r.MaxMs)
	fmt.Fprintf(w, "allowed     %d\n", r.Allowed)
	fmt.Fprintf(w, "denied      %d\n", r.Denied)
	fmt.Fprintf(w, "errors      %d\n", r.Errors)
	for _, s := range r.ErrorSamples {
		fmt.Fprintf(w, "  e.g. %s\n", s)
	}
	if r.Missed > 0 {
		fmt.Fprintf(w, "missed      %d scheduled checks were never sent: all %d in flight were waiting; the target (or this machine) cannot keep up with --rate\n", r.Missed, r.Concurrency)
	}
}
