// Package daemon assembles quotaflow's processes from their parts: a checker (engine, Redis,
// transports, admin API, publisher, rule-store watch) and an aggregator (ClickHouse, NATS,
// rule store, metrics port), and for development both in one process (ServePair) with a NATS
// server of its own (StartEmbeddedNATS). cmd/quotaflow turns flags into a config, checks it
// with the config's Validate, whose errors name the config's fields (the command names their
// flags), and starts one or both; tests start the same processes from a config struct
// (internal/testbed/daemontest).
//
// Each Start function follows one contract, gubernator's SpawnDaemon: it returns a running
// process or an error, and on any start-up failure it has already released everything it had
// acquired, in the reverse order. A running process has Done, Wait and Close: Done closes when
// it stops serving (Close, or a serving failure such as a lost port); Wait waits for that and
// releases it; Close stops it gracefully and releases it. Start-up policy (waiting for a rule
// store still being elected, whether the rules file may stand in meanwhile) lives here, not in
// the command.
package daemon

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/quotaflow/quotaflow/internal/telemetry"
)

// process is what the two kinds of daemons share: a run context ended by Close, the goroutines
// serving under it, and the resources to release after them, last acquired first.
type process struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	done   chan struct{}
	log    *slog.Logger

	mu       sync.Mutex
	serveErr error          // the first serving failure
	release  []func() error // undone by Close, last first

	closeOnce sync.Once
	closeErr  error
}

func newProcess(log *slog.Logger) *process {
	ctx, cancel := context.WithCancel(context.Background())
	return &process{ctx: ctx, cancel: cancel, done: make(chan struct{}), log: log}
}

// onClose registers f to run when the process is released, before what was registered earlier.
func (p *process) onClose(f func() error) { p.release = append(p.release, f) }

// goServe runs f under the run context; its error (other than the context's end) stops the
// whole process, as a lost port must.
func (p *process) goServe(f func(ctx context.Context) error) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		if err := f(p.ctx); err != nil && p.ctx.Err() == nil {
			p.mu.Lock()
			if p.serveErr == nil {
				p.serveErr = err
			}
			p.mu.Unlock()
			p.cancel()
		}
	}()
}

// started ends start-up: Done closes once every serving goroutine returned.
func (p *process) started() {
	go func() {
		p.wg.Wait()
		close(p.done)
	}()
}

// Done is closed when the process stopped serving: after Close, or on a serving failure.
func (p *process) Done() <-chan struct{} { return p.done }

// Wait waits until the process stops serving, releases it and returns why it stopped (nil
// after Close) joined with the errors of its release.
func (p *process) Wait() error {
	<-p.done
	return p.Close()
}

// Close stops serving (gracefully, within the shutdown timeout), waits for the serving
// goroutines and releases everything, last acquired first. It returns the serving failure, if
// any, joined with the release's errors; calling it again returns the same.
func (p *process) Close() error {
	p.closeOnce.Do(func() {
		p.cancel()
		p.wg.Wait()
		p.mu.Lock()
		errs := []error{p.serveErr}
		p.mu.Unlock()
		for i := len(p.release) - 1; i >= 0; i-- {
			errs = append(errs, p.release[i]())
		}
		p.closeErr = errors.Join(errs...)
	})
	return p.closeErr
}

// CloseTelemetry flushes tel, bounded: its spans' exporter may be unreachable. A process
// whose daemons share one telemetry (serve) calls it once they are closed.
func CloseTelemetry(tel *telemetry.Telemetry) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return tel.Close(ctx)
}
