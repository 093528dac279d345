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
-- then per call, in order: nk, na, its nk KEYS, its na ARGV (call.lua)
--
-- Reply: per call, in order, either c (the number of entries of its reply, >= 0) and those c
-- entries, or -1 and the error message the call would have got alone.
local m = int(ARGV[1])
if not m or m < 1 then
  return redis.error_reply('ERR bucket: malformed batch')
end
-- Where each call's arguments lie; all are checked to add up before any call runs, so that a
-- malformed batch changes nothing.
local at = sized(2 * m)
local p = 2
for c = 1, m do
  local nk, na = int(ARGV[p]), int(ARGV[p + 1])
  if not nk or not na or nk < 0 or na < 0 then
    return redis.error_reply('ERR bucket: malformed batch call ' .. c)
  end
  at[2 * c - 1], at[2 * c] = nk, na
  p = p + 2 + nk + na
end
if p ~= #ARGV + 1 then
  return redis.error_reply('ERR bucket: malformed batch')
end

local unpack = unpack
-- out is built at the size of m one-limit replies (and trimmed at the end: Redis's reply
-- stops at the first nil), since growing a table entry by entry costs more.
local out = sized(10 * m)
local k = 0
p = 2
for c = 1, m do
  local nk, na = at[2 * c - 1], at[2 * c]
  local keys, args = {unpack(ARGV, p + 2, p + 1 + nk)}, {unpack(ARGV, p + 2 + nk, p + 1 + nk + na)}
  p = p + 2 + nk + na
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
