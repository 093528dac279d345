package main

import (
	"context"
	"errors"
	"io"
	"path/filepath"

	"github.com/quotaflow/quotaflow/internal/app/daemon"
	"github.com/quotaflow/quotaflow/internal/app/natsauth"
	"github.com/quotaflow/quotaflow/internal/cli"
)

func runServe(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet("serve", help("serve"), stderr)
	var c checkerFlags
	var a aggregatorFlags
	var natsListen, natsDir, credsDir string
	c.register(fs)
	c.registerPublish(fs, ".dev/spool")
	a.register(fs, true)
	fs.StringVar(&natsListen, "nats-listen", "127.0.0.1:4222", "`address` of the embedded NATS server (used without --nats-url)")
	fs.StringVar(&natsDir, "nats-dir", ".dev/nats", "`folder` of the embedded NATS server's JetStream data")
	fs.StringVar(&credsDir, "nats-creds-dir", "", "`folder` of the NATS credentials of each role (`quotaflow nats-auth`): the checker, the admin API and the aggregator each connect with their own. With the embedded server: <--nats-dir>/auth, written on the first start (seeds 0600), and the server admits those users only")
	fs.FromEnv("nats-listen", "nats-dir", "nats-creds-dir")
	// Registered for the checker, where no NATS means no publishing; serve always publishes.
	fs.Describe("nats-url", "NATS `URL` of an external server for the decision stream and the rule store; empty: serve starts an embedded NATS server (--nats-listen, --nats-dir) and publishes there")
	fs.Describe("rules", "rules `file` (YAML) that seeds the rule store when it holds no rules yet, so required on the first start; with --nats-url it is also enforced while NATS is unreachable at start")
	if err := fs.Parse(args, getenv); err != nil {
		return err
	}
	embedded := c.cfg.NATSURL == ""
	if embedded {
		c.cfg.NATSURL = "nats://" + natsListen // validated below; replaced by the server's own URL
	}
	log, err := c.validate(stderr)
	if err != nil {
		return err
	}
	if embedded {
		if credsDir == "" {
			credsDir = filepath.Join(natsDir, "auth")
		}
		shutdown, err := startEmbeddedNATS(daemon.EmbeddedNATSConfig{Listen: natsListen, Dir: natsDir,
			CredentialsDir: credsDir, Partitions: c.cfg.Publisher.Partitions, Logger: log}, &c.cfg)
		if err != nil {
			return err
		}
		defer shutdown()
	}
	if credsDir != "" {
		useRoleCreds(credsDir, &c.cfg, &a.cfg)
	}
	if a.ch.dsn == "" {
		d, err := c.start(ctx)
		if err != nil {
			return err
		}
		return serveUntil(ctx, d)
	}
	if err := a.joinServe(&c); err != nil {
		return err
	}
	if c.cfg.Redis, err = c.redis.client(ctx); err != nil {
		return err
	}
	return flagErr(daemon.ServePair(ctx, c.cfg, a.cfg))
}

// startEmbeddedNATS starts serve's own NATS server and points the checker at it. shutdown stops the
// server and waits for it. Its errors name the flag at fault, but are not usage errors: the
// flags were fine, the server could not start with them.
func startEmbeddedNATS(cfg daemon.EmbeddedNATSConfig, checker *daemon.CheckerConfig) (shutdown func(), err error) {
	ns, err := daemon.StartEmbeddedNATS(cfg)
	if err != nil {
		var ue cli.UsageError
		if errors.As(cli.FlagError(err, map[string]string{"Listen": "nats-listen", "Dir": "nats-dir", "CredentialsDir": "nats-creds-dir"}), &ue) {
			return nil, ue.Err
		}
		return nil, err
	}
	checker.NATSURL = ns.ClientURL()
	return func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	}, nil
}

// useRoleCreds connects the checker, its admin API and the aggregator each with its own
// role's credentials from dir.
func useRoleCreds(dir string, checker *daemon.CheckerConfig, agg *daemon.AggregatorConfig) {
	checker.NATSCredentials = natsauth.SeedFile(dir, natsauth.Checker)
	checker.NATSAdminCredentials = natsauth.SeedFile(dir, natsauth.Admin)
	agg.NATSCredentials = natsauth.SeedFile(dir, natsauth.Aggregator)
}

// joinServe gives serve's aggregator what it shares with the checker (NATS, partitions,
// replicas, instance id, health reports) and checks its flags.
func (a *aggregatorFlags) joinServe(c *checkerFlags) error {
	a.cfg.NATSURL, a.natsTLS, a.cfg.Aggregator.Partitions = c.cfg.NATSURL, c.natsTLS, c.cfg.Publisher.Partitions
	a.cfg.Aggregator.Replicas, a.cfg.Aggregator.InstanceID = c.cfg.Publisher.Replicas, c.cfg.InstanceID
	a.cfg.Health, a.cfg.Aggregator.WebhookPolicy = c.cfg.Health, c.cfg.Admin.WebhookPolicy
	return a.validate()
}
