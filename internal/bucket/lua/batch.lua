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
local m = #CALLS / 2
-- out is built at the size of m one-limit replies (and trimmed at the end: Redis's reply
-- stops at the first nil), since growing a table entry by entry costs more.
local out = sized(10 * m)
local k = 0
for c = 1, m do
  local s, p = CALLS[2 * c - 1], CALLS[2 * c]
  local keys, args = {unpack(ARGV, p + 1, p + s.nk)}, s.argv
  if s.x > 0 then -- a copy: the spec's is shared
    args = {unpack(args)}
    local e = p + s.nk
    args[5] = ARGV[e + 1]
    for i = 1, s.n do
      args[5 + 5 * i] = ARGV[e + 1 + i]
    end
  end
  local ok, r = pcall(check, keys, args)
  if ok and type(r) == 'table' and not r.err then
    out[k + 1] = #r
    for i = 1, #r do
      out[k + 1 + i] = r[i]
    end
    k = k + 1 + #r
  else
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
