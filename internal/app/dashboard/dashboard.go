// Package dashboard draws the operators' terminal views of a running quotaflow: the one-screen
// health of every process (quotaflow status) and the live board of the busiest and the
// throttled subjects (quotaflow top). Both only read NATS: the health reports, the rule store's
// overrides and the two streams. It exists apart from cmd/quotaflow so that the command keeps
// to its flags, and apart from internal/app/report, whose renderings answer one call, because
// these follow the system while it runs and own the terminal while they do.
package dashboard
