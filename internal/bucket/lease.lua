-- lease: a slice of a fixed_window bucket's budget, taken by one checker to decide checks in
-- its own process, or the part of it that checker did not use, given back (Store.Lease,
-- Store.GiveBack; checker's leased rules). It is a script of its own, not a mode of check.lua:
-- every file under lua/ is part of the one check script, and a lease is no check.
--
-- The bucket is the one lua/fixed_window.lua keeps, in the same state, so leases, ordinary
-- charges and peeks of one key count against one counter: every unit a lease grants is counted
-- in the window's n when granted, whether or not its checker ever admits a check with it.
--
-- KEYS[1]  the fixed_window bucket key: hash {w = window id, n = count}
-- ARGV[1]  mode: "take" or "give"
-- ARGV[2]  L, the limit per window (take; ignored by give)
-- ARGV[3]  W, the window in µs
-- ARGV[4]  take: the units wanted; give: the units given back (>= 1, decimal integers)
-- ARGV[5]  give: the window id the units were taken in; take: ignored
--
-- Time comes only from redis.call('TIME'): now = sec * 1e6 + usec (µs); wid = floor(now / W).
-- A stored w ahead of the clock (the clock stepped back) is kept as the current window, as
-- fixed_window does.
-- take: grant = min(want, max(0, L - n)), a partial grant when the window has less left than
--   wanted (0 when it has nothing), and n += grant; a new window is written with PEXPIREAT its
--   end, as fixed_window writes it. Nothing is written for a grant of 0.
--   Reply: { granted, wid, now_us, reset_us, remaining } as decimal strings, reset_us = the end
--   of the window, (wid + 1) * W, remaining = L - n after the grant (>= 0).
-- give: n -= units (not below 0) when the stored window is ARGV[5]: units of a window that has
--   ended are gone with it. Reply: { given } (0 when the window has ended).
-- Commands: TIME, HMGET, and when it changes something HSET (+ PEXPIREAT for a new window).

local mode = ARGV[1]
local W = tonumber(ARGV[3])
local units = tonumber(ARGV[4])
if #KEYS ~= 1 or #ARGV ~= 5 or not W or W < 1 or not units or units < 1 then
  return redis.error_reply('ERR lease: malformed arguments')
end
local key = KEYS[1]
local v = redis.call('HMGET', key, 'w', 'n')
local sw = tonumber(v[1])

if mode == 'give' then
  local wid = tonumber(ARGV[5])
  if not wid then
    return redis.error_reply('ERR lease: give without window id')
  end
  if sw ~= wid then
    return { '0' }
  end
  local n = tonumber(v[2]) or 0
  local given = units
  if given > n then given = n end
  redis.call('HSET', key, 'n', string.format('%d', n - given))
  return { string.format('%d', given) }
end

if mode ~= 'take' then
  return redis.error_reply('ERR lease: unknown mode')
end
local L = tonumber(ARGV[2])
if not L or L < 1 then
  return redis.error_reply('ERR lease: malformed limit')
end
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
local wid = math.floor(now / W)
local n = 0
local same = false
if sw and sw >= wid then
  n = tonumber(v[2]) or 0
  same = true
  wid = sw
end
local grant = L - n
if grant < 0 then grant = 0 end
if grant > units then grant = units end
local reset = (wid + 1) * W
if grant > 0 then
  if same then
    redis.call('HSET', key, 'n', string.format('%d', n + grant))
  else
    redis.call('HSET', key, 'w', string.format('%d', wid), 'n', string.format('%d', grant))
    redis.call('PEXPIREAT', key, string.format('%d', math.ceil(reset / 1000)))
  end
end
local rem = L - n - grant
if rem < 0 then rem = 0 end
return { string.format('%d', grant), string.format('%d', wid), string.format('%d', now),
  string.format('%d', reset), string.format('%d', rem) }
