package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/internal/retry"
)

// JetStream API error codes that decide whether creating a stream or bucket may succeed later.
const (
	// codeReplicasNotSupported: replicas > 1 asked of a server that is not in a cluster.
	codeReplicasNotSupported = 10074
	// codeInsufficientResources: fewer servers (or less room) than the replicas asked for; also
	// what a cluster answers while its servers are still joining.
	codeInsufficientResources = 10023
	// codeNoSuitablePeers: no servers to place the replicas on, for the same reasons.
	codeNoSuitablePeers = 10005
)

// ReplicasError is a stream or bucket that the NATS servers cannot hold with the replica count
// asked for: a server outside any cluster and more than one replica, or fewer servers in the
// cluster than replicas.
type ReplicasError struct {
	Replicas int
	Err      error
}

func (e *ReplicasError) Error() string {
	return fmt.Sprintf("%d replicas: the NATS servers cannot hold them (a server outside a cluster holds 1; a cluster holds at most one per server): %v",
		e.Replicas, e.Err)
}

func (e *ReplicasError) Unwrap() error { return e.Err }

// EnsureConfig tunes Ensure. The zero value is usable.
type EnsureConfig struct {
	// Replicas is the replica count the call asks for, named by a ReplicasError.
	Replicas int
	// Attempt bounds one call (5s).
	Attempt time.Duration
	// ResourcesWait is how long "insufficient resources" is taken for servers still joining
	// before it is a ReplicasError (30s).
	ResourcesWait time.Duration
	// MaxBackoff bounds the pause between calls (2s).
	MaxBackoff time.Duration
}

// Ensure calls create until it succeeds, for as long as the failure is one that time mends:
// no JetStream answering yet (a cluster electing its meta leader, a server starting), a
// timeout, a server error. A NATS cluster that is still forming answers all of these at first,
// and the components started with it must wait for it rather than give up. The first failure,
// then every tenth, is logged as a warning naming what; the first success after a warning is
// logged too.
//
// It returns at once, without retrying, an error that time does not mend (a bad request, a
// stream whose settings conflict), a *ReplicasError for replicas a server outside a cluster
// cannot hold, and after cfg.ResourcesWait of "insufficient resources" or "no suitable peers",
// a *ReplicasError too.
// It returns ctx's error, wrapping the last failure, when ctx ends.
func Ensure(ctx context.Context, log *slog.Logger, what string, cfg EnsureConfig, create func(ctx context.Context) error) error {
	if cfg.Attempt <= 0 {
		cfg.Attempt = 5 * time.Second
	}
	if cfg.ResourcesWait <= 0 {
		cfg.ResourcesWait = 30 * time.Second
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 2 * time.Second
	}
	b := retry.Backoff{Min: 100 * time.Millisecond, Max: cfg.MaxBackoff}
	var insufficientSince time.Time
	for failures := 0; ; failures++ {
		actx, cancel := context.WithTimeout(ctx, cfg.Attempt)
		err := create(actx)
		cancel()
		if err == nil {
			if failures > 0 {
				log.Info("nats ready: "+what, "attempts", failures+1)
			}
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w (last error: %w)", what, ctx.Err(), err)
		}
		switch code := apiCode(err); {
		case code == codeReplicasNotSupported:
			return fmt.Errorf("%s: %w", what, &ReplicasError{Replicas: cfg.Replicas, Err: err})
		case code == codeInsufficientResources, code == codeNoSuitablePeers:
			if insufficientSince.IsZero() {
				insufficientSince = time.Now()
			} else if time.Since(insufficientSince) > cfg.ResourcesWait {
				return fmt.Errorf("%s: %w", what, &ReplicasError{Replicas: cfg.Replicas, Err: err})
			}
		case !Transient(err):
			return fmt.Errorf("%s: %w", what, err)
		}
		wait := b.Next()
		if failures%10 == 0 {
			log.Warn("nats not ready: "+what+"; retrying", "err", err, "attempts", failures+1, "retry_in", wait)
		}
		if !retry.Sleep(ctx, wait) {
			return fmt.Errorf("%s: %w (last error: %w)", what, ctx.Err(), err)
		}
	}
}

// Transient reports whether a JetStream call's failure may pass by itself: the server did not
// answer (no responders while JetStream starts or elects, a timeout, a lost connection) or
// answered with a server-side error (5xx: no meta leader yet, leader changing, no room).
func Transient(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.Code >= 500 && apiErr.ErrorCode != codeReplicasNotSupported
	}
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrConnectionClosed) ||
		errors.Is(err, nats.ErrDisconnected) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, nats.ErrReconnectBufExceeded) || // not connected yet, and Connect buffers nothing
		errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount)
}

// apiCode is the JetStream error code of err, 0 when it carries none.
func apiCode(err error) jetstream.ErrorCode {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode
	}
	return 0
}

// CheckReplicas reports, as a *ReplicasError, a replica count the NATS servers behind nc
// cannot hold: more than one on a server outside a cluster, or more than the servers the
// connection knows of in a cluster (those named and those the cluster announced). It waits
// for the connection until ctx ends and says nothing when it never comes: the caller then
// learns it from the first stream it creates.
func CheckReplicas(ctx context.Context, nc *nats.Conn, replicas int) error {
	if replicas <= 1 {
		return nil
	}
	for !nc.IsConnected() {
		if !retry.Sleep(ctx, 20*time.Millisecond) {
			return nil
		}
	}
	if nc.ConnectedClusterName() == "" {
		return &ReplicasError{Replicas: replicas, Err: fmt.Errorf("%s is not in a cluster", nc.ConnectedUrlRedacted())}
	}
	if known := len(nc.Servers()); known < replicas {
		return &ReplicasError{Replicas: replicas, Err: fmt.Errorf("cluster %s has %d servers", nc.ConnectedClusterName(), known)}
	}
	return nil
}
