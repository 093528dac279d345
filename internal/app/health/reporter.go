package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/quotaflow/quotaflow/internal/field"
	"github.com/quotaflow/quotaflow/internal/instance"
)

// Config configures a Reporter. The zero value is usable: a report every 2s, kept 3 intervals.
type Config struct {
	// Interval is the time between reports (2s); negative turns reporting off (the daemons do
	// not start a Reporter then).
	Interval time.Duration
	// KeepIntervals is how many intervals a report outlives its process (3): the bucket's
	// max age, set when the bucket is created. An existing bucket is used as it is.
	KeepIntervals int
	// Replicas of the bucket when the reporter creates it (1).
	Replicas int
	// Logger receives the reporter's logs, with "component"="health"; nil means slog.Default().
	Logger *slog.Logger
}

// Defaults of Config's zero fields.
const (
	DefaultInterval      = 2 * time.Second
	DefaultKeepIntervals = 3
)

// Validate reports an Interval too short to report at, as a *field.Error naming it: a report
// costs a NATS write, and quotaflow status reads a process as gone after a few intervals.
// Unlike the Reporter it reads a zero Interval as given, not as its default: it is for a
// command line, where 0 is a mistake.
func (c Config) Validate() error {
	if c.Interval >= 0 && c.Interval < 100*time.Millisecond {
		return field.Errorf("Interval", "want at least 100ms, or negative for no reports, got %s", c.Interval)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.KeepIntervals <= 0 {
		c.KeepIntervals = DefaultKeepIntervals
	}
	c.Replicas = max(1, c.Replicas)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Disabled reports whether c turns reporting off.
func (c Config) Disabled() bool { return c.Interval < 0 }

// Source is a process's view of itself, taken at every report: Checker and Aggregator.
type Source interface {
	// Role and Instance name the process in the bucket.
	Role() string
	Instance() string
	// Observe fills r's Dependencies and its role's view; interval is the time since the last
	// Observe (0 the first time), over which rates are taken.
	Observe(ctx context.Context, r *Report, interval time.Duration)
}

// Reporter puts its Source's Report into the bucket every interval until Close.
type Reporter struct {
	cfg     Config
	js      jetstream.JetStream
	src     Source
	log     *slog.Logger
	key     string
	started time.Time
	version string
	host    string
	since   map[string]Dependency // the states seen last, for Dependency.Since

	kv      jetstream.KeyValue // nil until the bucket could be opened
	failing bool               // the last report was not stored
	cancel  context.CancelFunc
	done    chan struct{}
	once    sync.Once
}

// Start begins reporting src's view into js's bucket: at once, then every cfg.Interval. It
// never fails: while NATS cannot take the report, it logs and tries again at the next interval.
func Start(js jetstream.JetStream, src Source, cfg Config) *Reporter {
	cfg = cfg.withDefaults()
	host, _ := os.Hostname()
	r := &Reporter{cfg: cfg, js: js, src: src, log: cfg.Logger.With("component", "health"),
		key: Key(src.Role(), src.Instance()), started: time.Now(), version: instance.Build(), host: host,
		since: map[string]Dependency{}, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go r.run(ctx)
	return r
}

// Close stops reporting and removes the report, so that a process that stops cleanly leaves
// the list at once rather than when its report expires. A report NATS cannot remove now
// expires by itself: that is logged, never an error of the process's stop.
func (r *Reporter) Close() error {
	r.once.Do(func() {
		r.cancel()
		<-r.done
		if r.kv == nil || r.failing {
			return // NATS did not take the last report: the delete would only wait; it expires
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := r.kv.Delete(ctx, r.key); err != nil {
			r.log.Warn("health report not removed; it expires by itself", "key", r.key, "err", err)
		}
	})
	return nil
}

func (r *Reporter) run(ctx context.Context) {
	defer close(r.done)
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	var last time.Time
	for {
		now := time.Now()
		var since time.Duration
		if !last.IsZero() {
			since = now.Sub(last)
		}
		last = now
		err := r.report(ctx, since)
		switch {
		case err != nil && ctx.Err() == nil && !r.failing:
			r.log.Warn("health report not stored; trying again every interval", "err", err)
			r.failing = true
		case err == nil && r.failing:
			r.log.Info("health report stored again")
			r.failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// report takes one report and stores it.
func (r *Reporter) report(ctx context.Context, interval time.Duration) error {
	cctx, cancel := context.WithTimeout(ctx, r.cfg.Interval)
	defer cancel()
	rep := Report{Role: r.src.Role(), Instance: r.src.Instance(), Version: r.version, Host: r.host,
		Started: r.started, Interval: r.cfg.Interval, Dependencies: map[string]Dependency{}}
	r.src.Observe(cctx, &rep, interval)
	rep.At = time.Now()
	r.stamp(&rep)
	b, err := json.Marshal(rep)
	if err != nil {
		return fmt.Errorf("encode health report: %w", err)
	}
	if r.kv == nil {
		if r.kv, err = r.bucket(cctx); err != nil {
			return err
		}
	}
	if _, err := r.kv.Put(cctx, r.key, b); err != nil {
		return fmt.Errorf("put health report: %w", err)
	}
	return nil
}

// stamp sets each dependency's Since: when its state was first seen, unless the source knew.
func (r *Reporter) stamp(rep *Report) {
	for name, d := range rep.Dependencies {
		prev, ok := r.since[name]
		switch {
		case !d.Since.IsZero():
		case ok && prev.State == d.State:
			d.Since = prev.Since
		default:
			d.Since = rep.At
		}
		rep.Dependencies[name] = d
		r.since[name] = d
	}
}

// bucket opens the bucket, creating it when missing.
func (r *Reporter) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := r.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: Bucket, History: 1,
		TTL: time.Duration(r.cfg.KeepIntervals) * r.cfg.Interval, Replicas: r.cfg.Replicas,
		Description: "quotaflow processes' health reports (quotaflow status)"})
	if errors.Is(err, jetstream.ErrBucketExists) {
		kv, err = r.js.KeyValue(ctx, Bucket)
	}
	if err != nil {
		return nil, fmt.Errorf("health bucket: %w", err)
	}
	return kv, nil
}

// Key is the bucket's key of a process: "<role>.<instance>", the instance's characters that a
// key cannot hold replaced by '_'.
func Key(role, instance string) string {
	return role + "." + strings.Map(func(c rune) rune {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '=':
			return c
		}
		return '_'
	}, instance)
}
