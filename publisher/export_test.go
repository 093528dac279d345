package publisher

// NATSURL is the URL of the package's test NATS server, for the examples.
func NATSURL() string { return srv.URL }
