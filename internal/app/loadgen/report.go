package loadgen

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
)

// Report is what a run measured. Its JSON keys checks_per_sec, p50_ms, p90_ms, p99_ms,
// p999_ms, allowed, denied and errors are a stable interface for scripts.
type Report struct {
	Protocol     string  `json:"protocol"`
	Mode         string  `json:"mode"` // closed or open
	Concurrency  int     `json:"concurrency"`
	Rate         float64 `json:"rate"`
	Batch        int     `json:"batch,omitempty"` // checks per RPC, when more than one
	Keys         int     `json:"keys"`
	Distribution string  `json:"distribution"`
	DurationS    float64 `json:"duration_s"` // measured time
	Checks       uint64  `json:"checks"`     // allowed + denied + errors
	ChecksPerSec float64 `json:"checks_per_sec"`
	P50Ms        float64 `json:"p50_ms"`
	P90Ms        float64 `json:"p90_ms"`
	P99Ms        float64 `json:"p99_ms"`
	P999Ms       float64 `json:"p999_ms"`
	MaxMs        float64 `json:"max_ms"`
	MeanMs       float64 `json:"mean_ms"`
	Allowed      uint64  `json:"allowed"`
	Denied       uint64  `json:"denied"`
	Errors       uint64  `json:"errors"`
	// Degraded of the allowed and denied were answered by the checker's fail modes (Redis did
	// not answer in time), DegradedDenied of the denied: not the limits' throttling. Connect
	// and gRPC only: RLS and Gubernator answers do not say.
	Degraded       uint64 `json:"degraded"`
	DegradedDenied uint64 `json:"degraded_denied"`
	Missed         uint64 `json:"missed"` // open loop: scheduled checks never sent
	// Interrupted says the run's context ended before the run did.
	Interrupted  bool     `json:"interrupted,omitempty"`
	ErrorSamples []string `json:"error_samples,omitempty"` // the first few distinct errors

	cfg Config // the run's settings, for the text report's heading
}

// WriteText writes r for people to read, as `quotaflow bench` prints it. The heading needs the
// settings of the run, which only a Report returned by Run has.
func (r *Report) WriteText(w io.Writer) error {
	var b bytes.Buffer
	mode := fmt.Sprintf("closed loop with %d workers", r.Concurrency)
	if r.Mode == "open" {
		mode = fmt.Sprintf("open loop at %g checks/s, at most %d in flight", r.Rate, r.Concurrency)
	}
	if r.Batch > 1 {
		mode += fmt.Sprintf(", %d checks per RPC", r.Batch)
	}
	fmt.Fprintf(&b, "quotaflow bench: %s to %s for %s, %s\n", r.cfg.Protocol, r.cfg.Target, r.cfg.Duration, mode)
	fmt.Fprintf(&b, "  %d %s subjects (%s) on %s\n", r.Keys, r.cfg.Dimension, r.Distribution, r.cfg.Endpoint)
	if r.Interrupted {
		fmt.Fprintf(&b, "  interrupted after %.3fs\n", r.DurationS)
	}
	fmt.Fprintf(&b, "checks/s    %.1f  (%d checks in %.3fs)\n", r.ChecksPerSec, r.Checks, r.DurationS)
	fmt.Fprintf(&b, "latency ms  p50 %.3f  p90 %.3f  p99 %.3f  p99.9 %.3f  max %.3f\n", r.P50Ms, r.P90Ms, r.P99Ms, r.P999Ms, r.MaxMs)
	fmt.Fprintf(&b, "allowed     %d\n", r.Allowed)
	fmt.Fprintf(&b, "denied      %d\n", r.Denied)
	fmt.Fprintf(&b, "errors      %d\n", r.Errors)
	if r.Degraded > 0 {
		fmt.Fprintf(&b, "degraded    %d of the answers, %d of the denials: given by fail modes, Redis not answering in time (not the limits)\n", r.Degraded, r.DegradedDenied)
	}
	for _, s := range r.ErrorSamples {
		fmt.Fprintf(&b, "  e.g. %s\n", s)
	}
	if r.Missed > 0 {
		fmt.Fprintf(&b, "missed      %d scheduled checks were never sent: all %d in flight were waiting; the target (or this machine) cannot keep up with --rate\n", r.Missed, r.Concurrency)
	}
	_, err := b.WriteTo(w)
	return err
}

// WriteJSON writes r to w as one line of JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	return json.NewEncoder(w).Encode(r)
}
