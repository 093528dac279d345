-- hold: releases or renews a place held in flight by a concurrency limit's charge
-- (lua/concurrency.lua), by its holder's id. Time comes from redis.call('TIME') (+ SHIFT, 0
-- but in tests).
--
-- KEYS[1]  the concurrency bucket
-- ARGV[1]  "release" or "renew"
-- ARGV[2]  the holder's id
-- ARGV[3]  renew: the new TTL from now, µs (>= 1); release: ignored
-- ARGV[4]  SHIFT, µs
--
-- Reply: {status, expiry_us}: status "held" (released, or renewed until expiry_us), "expired"
-- (the place had freed itself at expiry_us; it is removed now), "unknown" (no such holder:
-- never held, already released, or expired and pruned). Nothing is changed but for "held" and
-- "expired": a release twice is "unknown" the second time, never a second free.
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000000 + tonumber(tm[2]) + (tonumber(ARGV[4]) or 0)
local key, op, id = KEYS[1], ARGV[1], ARGV[2]
if op ~= 'release' and op ~= 'renew' then
  return redis.error_reply('ERR hold: unknown operation')
end
local score = tonumber(redis.call('ZSCORE', key, id))
if not score then
  return {'unknown', '0'}
end
if score <= now then
  redis.call('ZREM', key, id)
  return {'expired', string.format('%d', score)}
end
if op == 'release' then
  redis.call('ZREM', key, id)
  return {'held', string.format('%d', score)}
end
local ttl = tonumber(ARGV[3])
if not ttl or ttl < 1 then
  return redis.error_reply('ERR hold: malformed TTL')
end
local expiry = now + ttl
redis.call('ZADD', key, 'XX', string.format('%d', expiry), id)
local last = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2]) or expiry
redis.call('PEXPIREAT', key, string.format('%d', math.ceil(last / 1000)))
return {'held', string.format('%d', expiry)}
