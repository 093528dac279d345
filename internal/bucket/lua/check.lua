-- check: the driver of one call. KEYS and ARGV are the call's (call.lua); so is the reply.
return check(KEYS, ARGV)
