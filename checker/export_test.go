package checker

// RedisAddr is the address of the package's test Redis, for the examples.
func RedisAddr() string { return redisSrv.Addr }
