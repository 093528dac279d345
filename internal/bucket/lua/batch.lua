-- batch: the driver of many calls in one script run, so that a pipeline of checks costs Redis
-- one EVALSHA instead of one per check. Each call is decided by call.lua's check, exactly as
-- check.lua decides it alone, and all of them at one instant (clock). A call that fails (a
-- malformed call, a key of another type, a key this cluster node does not serve) fails alone:
-- the calls before it keep their effects, those after it still run.
--
-- KEYS         none: a call's keys travel in ARGV, so that calls of many slots share one run.
--              On a cluster, the script's first line, flags=allow-cross-slot-keys, lets it
--              touch keys of several slots, all of which must be served by this node: a key
--              that is not (its slot moved or is moving) fails its call with Redis's error
--              before anything of that call ran, since a call reads all its keys before it
--              writes any, and Store re-sends that call alone, with its keys declared.
-- ARGV[1]      m, the number of calls (>= 1)
-- then per call, in order: its head, its KEYS, its extras. The head is the call's ARGV
--              (call.lua) without its strings, as one string of space-separated fields:
--              n cost mode idem_ttl x, then code L W B per limit. x is the number of extras:
--              0 when the call's fingerprint or charge time (ARGV[5]) and its refund tokens are
--              all empty, else n + 1, those n + 1 values in ARGV's order. It has
--              n + (idem_ttl ~= "0" and 1 or 0) KEYS (call.lua). Heads repeat from call to
--              call (one per rule and mode), so that a call costs Redis two or three arguments
--              instead of 8 + 5 per limit, and its parse is paid once per batch (need.lua).
--
-- Reply: per call, in order, either c (the number of entries of its reply, >= 0) and those c
-- entries, or -1 and the error message the call would have got alone.
if not CALLS then
  return redis.error_reply('ERR bucket: malformed batch')
end

local unpack = unpack

-- quick is the common call, a charge of one limit with no idempotency record and no extras
-- (a head "1 <cost> 0 0 0 <code> <L> <W> <B>"), decided as call.lua's one decides it, by the
-- same module functions, without what one pays to be general: the call's KEYS and ARGV tables,
-- the parse and validation of its arguments (done once per head, by quickSpec) and its reply
-- table (the fields go straight into the batch's reply). Its replies are one's: allowed, used,
-- remaining, reset, retry_after, refund token.
local function quick(key, q, now, now_s)
  local L, W, B, Bs, cost = q[3], q[4], q[5], q[6], q[7]
  local ok, used, rem, reset, a1, a2, a3, s1, s2, s3 = q[1](key, L, W, B, now, cost, Bs, '')
  if ok then
    return 1, a1, a2, ceil_us(a3), '0', q[2](key, L, W, B, now, now_s, cost, Bs, s1, s2, s3, '')
  end
  local retry = a1
  if cost > B and retry < W then retry = W end
  if retry < 1 then retry = 1 end
  return 0, used, rem, ceil_us(reset), retry, ''
end

-- quickSpec returns the quick form of spec s ({eval, commit, L, W, B, Bs, cost}), or false when
-- its calls are not such charges or their arguments are malformed: check then decides them,
-- and reports what is malformed.
local function quickSpec(s)
  local a = s.argv
  if s.n ~= 1 or s.x ~= 0 or s.nk ~= 1 or a[3] ~= '0' or a[4] ~= '0' then
    return false
  end
  local ev, cm = modules(a[6])
  local cost, L, W, B = int(a[2]), int(a[7]), int(a[8]), int(a[9])
  if not ev or not cost or cost < 1 or not L or L < 0 or L == 0 and a[6] ~= '3' or not W or W < 1 or not B or B < 1 then
    return false
  end
  return {ev, cm, L, W, B, a[9], cost}
end

-- call decides the call whose spec is s and whose head is ARGV[p] by check, as check.lua would
-- decide it alone.
local function call(s, p)
  local keys, args = {unpack(ARGV, p + 1, p + s.nk)}, s.argv
  if s.x > 0 then -- a copy: the spec's is shared
    args = {unpack(args)}
    local e = p + s.nk
    args[5] = ARGV[e + 1]
    for i = 1, s.n do
      args[5 + 5 * i] = ARGV[e + 1 + i]
    end
  end
  return check(keys, args)
end

local m = #CALLS / 2
-- out is built at the size of m one-limit replies (and trimmed at the end: Redis's reply
-- stops at the first nil), since growing a table entry by entry costs more.
local out = sized(10 * m)
local k = 0
for c = 1, m do
  local s, p = CALLS[2 * c - 1], CALLS[2 * c]
  local q = s.quick
  if q == nil then
    q = quickSpec(s)
    s.quick = q
  end
  local ok, r, f2, f3, f4, f5, f6
  if q then
    local now, now_s = clock()
    ok, r, f2, f3, f4, f5, f6 = pcall(quick, ARGV[p + 1], q, now, now_s)
    if ok then
      out[k + 1], out[k + 2], out[k + 3], out[k + 4], out[k + 5] = 9, r, now_s, 0, r
      out[k + 6], out[k + 7], out[k + 8], out[k + 9], out[k + 10] = f2, f3, f4, f5, f6
      k = k + 10
    end
  else
    ok, r = pcall(call, s, p)
    if ok then
      if type(r) == 'table' and not r.err then
        out[k + 1] = #r
        for i = 1, #r do
          out[k + 1 + i] = r[i]
        end
        k = k + 1 + #r
      else
        ok = false
      end
    end
  end
  if not ok then
    -- A script's error_reply, or an error raised by redis.call (a table with err since Redis
    -- 7.0) or by Lua itself (a string).
    if type(r) == 'table' then
      r = r.err
    elseif type(r) == 'string' and not string.find(r, '^%u+ ') then
      r = 'ERR ' .. r -- a Lua error, not a Redis reply with its code
    end
    out[k + 1], out[k + 2] = -1, tostring(r)
    k = k + 2
  end
end
out[k + 1] = nil
return out
