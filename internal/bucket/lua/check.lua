-- check: the driver. Store runs prelude.lua + the six algorithm files + this file as ONE
-- script, so that every limit of one subject is evaluated and charged atomically even when
-- the limits use different algorithms.
--
-- KEYS[1..n]   the limit keys (all in one cluster slot)
-- KEYS[n+1]    the idempotency record key, present only when ARGV[4] ~= "0"
-- ARGV[1]      n, the number of limits (>= 1)
-- ARGV[2]      cost (>= 1)
-- ARGV[3]      mode: 0 charge, 1 peek, 2 refund
-- ARGV[4]      idempotency TTL in ms; "0" = no idempotency key
-- ARGV[5]      refund only: now_us of the charge being refunded (else "")
-- then 5 per limit i, at ARGV[5 + 5*(i-1) + 1 ..]:
--              algorithm code (1 token_bucket, 2 leaky_bucket, 3 fixed_window,
--              4 sliding_window_log, 5 sliding_window_counter, 6 gcra), limit,
--              window_us, burst (capacity, already resolved, >= 1),
--              refund token (refund only; else "")
--
-- Time comes only from redis.call('TIME'): now_us = sec * 1e6 + usec.
--
-- Charge: when the idempotency record exists, its stored reply is returned with replayed = 1
-- and nothing changes. Otherwise every limit is evaluated; only if ALL allow is every limit's
-- new state written (a denied check writes nothing). Then, with an idempotency key, the reply
-- (allowed or denied) is stored under it with PX = ARGV[4].
-- Peek: evaluate only; the reply gives the state before consumption and whether cost fits.
-- Refund: give cost back to every limit exactly (see each algorithm), delete the idempotency
-- record (the charge it protected no longer exists, so a retry must be evaluated afresh),
-- then reply like a peek of the state after the refund.
--
-- Reply: { allowed (0/1), now_us (string), replayed (0/1), then 6 per limit:
--          allowed (0/1), used (integer, rounded up), remaining (integer, rounded down, >= 0),
--          reset_at_us (string), retry_after_us (string; "0" when allowed, >= 1 when denied),
--          refund_token (string, "" unless a charge needs one) }
-- Big values travel as strings: replies truncate Lua numbers and tostring keeps 14 digits.
-- A cost above a limit's capacity can never fit; its retry_after is then at least one window.

local n = tonumber(ARGV[1])
local cost = tonumber(ARGV[2])
local mode = tonumber(ARGV[3])
local idem_ttl = tonumber(ARGV[4])
if not n or n < 1 or #ARGV ~= 5 + 5 * n or not cost or cost < 1 or not idem_ttl
    or (mode ~= 0 and mode ~= 1 and mode ~= 2) then
  return redis.error_reply('ERR bucket: malformed arguments')
end
local idem
if idem_ttl > 0 then
  idem = KEYS[n + 1]
end
if #KEYS ~= n + (idem and 1 or 0) then
  return redis.error_reply('ERR bucket: wrong number of keys')
end

local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])

if mode == 0 and idem then
  local rec = redis.call('GET', idem)
  if rec then
    local reply = cmsgpack.unpack(rec)
    reply[3] = 1
    return reply
  end
end

local modules = {}
local lims = {}
for i = 1, n do
  local b = 5 + (i - 1) * 5
  local code = tonumber(ARGV[b + 1])
  local A = modules[code]
  if not A and ALG[code] then
    A = ALG[code]()
    modules[code] = A
  end
  local p = {limit = tonumber(ARGV[b + 2]), window = tonumber(ARGV[b + 3]), burst = tonumber(ARGV[b + 4])}
  if not A or not p.limit or p.limit < 1 or not p.window or p.window < 1 or not p.burst or p.burst < 1 then
    return redis.error_reply('ERR bucket: malformed limit ' .. i)
  end
  lims[i] = {A = A, p = p, token = ARGV[b + 5]}
end

if mode == 2 then
  local charge_now = tonumber(ARGV[5])
  if not charge_now then
    return redis.error_reply('ERR bucket: refund without charge time')
  end
  for i = 1, n do
    lims[i].A.refund(KEYS[i], lims[i].p, now, cost, charge_now, lims[i].token)
  end
  if idem then
    redis.call('DEL', idem)
  end
end

local rs = {}
local all = true
for i = 1, n do
  local r = lims[i].A.eval(KEYS[i], lims[i].p, now, cost)
  rs[i] = r
  if not r.ok then all = false end
end

local charged = mode == 0 and all
local reply = {all and 1 or 0, us(now), 0}
for i = 1, n do
  local r, p = rs[i], lims[i].p
  local used, rem, reset, retry, token = r.used, r.rem, r.reset, 0, ''
  if charged then
    used, rem, reset = r.aused, r.arem, r.areset
    token = lims[i].A.commit(KEYS[i], p, now, cost, r)
  elseif not r.ok then
    retry = r.retry
    if cost > p.burst and retry < p.window then retry = p.window end
    if retry < 1 then retry = 1 end
  end
  local k = #reply
  reply[k + 1] = r.ok and 1 or 0
  reply[k + 2] = used
  reply[k + 3] = rem
  reply[k + 4] = us(ceil_us(reset))
  reply[k + 5] = us(retry)
  reply[k + 6] = token
end

if mode == 0 and idem then
  redis.call('SET', idem, cmsgpack.pack(reply), 'PX', idem_ttl)
end
return reply
