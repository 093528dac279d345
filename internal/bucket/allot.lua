-- lease: a slice of a fixed_window bucket's budget, taken by one checker to decide checks in
-- its own process, or the part of it that checker did not use, given back (Store.Allot,
-- Store.GiveBack; checker's allotted rules). It is a script of its own, not a mode of check.lua:
-- every file under lua/ is part of the one check script, and an allotment is no check.
--
-- The bucket is the one lua/fixed_window.lua keeps, in the same state, so allotments, ordinary
-- charges and peeks of one key count against one counter: every unit an allotment grants is counted
-- in the window's n when granted, whether or not its checker ever admits a check with it.
--
-- KEYS[1]  the fixed_window bucket key, in either of fixed_window's layouts (see below)
-- KEYS[2]  the mixed and shared layouts only: the bucket's shared hash (below)
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
-- State: fixed_window's, in the layout the key is in. The previous layout is a hash
--   {w = window id, n = count}; the compact one (--bucket-layout compact, in the versions that
--   have it) a string "<n * 8 + wid % 8>" expiring at its window's end, whose window is the
--   current one when its low bits say so and else (wid + 1) * W = PEXPIRETIME * 1000 (see
--   lua/fixed_window.lua where it has that layout). An allotment reads both; it writes a count of
--   the stored window in the key's own layout (SET KEEPTTL keeps a compact key compact), and a
--   new window as a hash, which every version reads (a compact writer converts it at its next
--   charge): so allotments work whatever layout the checkers write, and write what all can read.
-- Shared hashes (the mixed and shared layouts, FIELDS; Store sends this file after its
--   layout's lines and lua/shared.lua): the bucket may be a field of KEYS[2], as
--   lua/fixed_window.lua keeps it. An allotment reads and writes where fixed_window does: a shared
--   writer (SHARED) the field first, then the key, whose state it moves into the field; a
--   mixed one the key first, then the field; a bucket with a field, live or expired, is
--   written there.
-- Commands: TIME, HMGET (GET and PEXPIRETIME on a compact key), and when it changes something
-- HSET (+ PEXPIREAT for a new window, DEL first over a compact key of an older window) or
-- SET KEEPTTL; HMGET (fget) of its field, in the order above, and fset to write one (+ DEL of a
-- key a shared writer moves).

local mode = ARGV[1]
local W = tonumber(ARGV[3])
local units = tonumber(ARGV[4])
if #KEYS ~= (FIELDS and 2 or 1) or #ARGV ~= 5 or not W or W < 1 or not units or units < 1 then
  return redis.error_reply('ERR lease: malformed arguments')
end
local key = KEYS[1]
local floor, format = math.floor, string.format
-- clock reads Redis's time in µs.
local function clock()
  local tm = redis.call('TIME')
  return tonumber(tm[1]) * 1000000 + tonumber(tm[2])
end
-- fields: whether the bucket may be a field of KEYS[2] (the mixed and shared layouts,
-- fixed_window's rule: W >= 1 ms). e is the expiry of its field as read (0 for none); clk the
-- time the field's expiry is compared with.
local fields, e, clk = FIELDS and W >= 1000, 0, nil
if fields then
  HASH, clk = KEYS[2], clock()
end

-- field reads the bucket's field: the window id and count it holds (nil and 0 when it holds
-- nothing live, e = 0) and whether there is one, live or expired (shared.lua: then the bucket
-- is written there).
local function field()
  local v
  v, e = fget(key, clk)
  if v then
    return floor(e * 1000 / W) - 1, tonumber(v) or 0, true
  end
  e = 0
  return nil, 0, v == false
end

-- read returns the stored window id (nil for none), its count, what holds it ('h' a hash, 's' a
-- compact string, 'f' its field, false nothing) and, for a compact string, its value's low
-- bits. now is the current time in µs, for the compact layout's low bits (nil when unknown:
-- give). It asks where fixed_window's eval asks: the field first in the shared layout, the key
-- first in the mixed one.
local function read(now)
  if fields and SHARED then
    local sw, n, has = field()
    if has then
      return sw, n, 'f'
    end
  end
  local h = redis.pcall('HMGET', key, 'w', 'n')
  if not h.err then
    local sw = tonumber(h[1])
    if not sw and fields and not SHARED then
      local fw, n, has = field()
      if has then
        return fw, n, 'f'
      end
    end
    return sw, tonumber(h[2]) or 0, sw and 'h' or false
  end
  local v = tonumber(redis.call('GET', key)) or 0
  local r = v % 8
  local n = (v - r) / 8
  if now and r == floor(now / W) % 8 then
    return floor(now / W), n, 's', r
  end
  local e = redis.call('PEXPIRETIME', key)
  if e < 0 then -- no expiry: never written so by a checker; counted as the current window's
    return now and floor(now / W), n, 's', r
  end
  return floor(e * 1000 / W) - 1, n, 's', r
end

-- write stores count n of window wid, held as read said (r: a compact string's low bits).
local function write(held, wid, n, r, reset)
  if held == 'f' or fields and SHARED then
    if held and held ~= 'f' then
      redis.call('DEL', key) -- read from its key: a shared writer moves it into its field
    end
    fset(key, format('%d', n), math.ceil((wid + 1) * W / 1000), e, clk)
    return
  end
  if held == 's' then
    redis.call('SET', key, format('%d', n * 8 + r), 'KEEPTTL')
    return
  end
  if held == 'h' then
    redis.call('HSET', key, 'n', format('%d', n))
    return
  end
  redis.call('DEL', key) -- a compact string of an older window, which HSET cannot write over
  redis.call('HSET', key, 'w', format('%d', wid), 'n', format('%d', n))
  redis.call('PEXPIREAT', key, format('%d', math.ceil(reset / 1000)))
end

if mode == 'give' then
  local wid = tonumber(ARGV[5])
  if not wid then
    return redis.error_reply('ERR lease: give without window id')
  end
  local sw, n, held, r = read(nil)
  if sw ~= wid then
    return { '0' }
  end
  local given = units
  if given > n then given = n end
  write(held, wid, n - given, r)
  return { format('%d', given) }
end

if mode ~= 'take' then
  return redis.error_reply('ERR lease: unknown mode')
end
local L = tonumber(ARGV[2])
if not L or L < 1 then
  return redis.error_reply('ERR lease: malformed limit')
end
local now = clk or clock()
local wid = floor(now / W)
local sw, n, held, r = read(now)
if sw and sw >= wid then
  wid = sw
else
  -- Nothing of the current window: a new one is written as a hash.
  n = 0
  if held ~= 'f' then
    held = held and 'x' or false
  end
end
local grant = L - n
if grant < 0 then grant = 0 end
if grant > units then grant = units end
local reset = (wid + 1) * W
if grant > 0 then
  write(held, wid, n + grant, r, reset)
end
local rem = L - n - grant
if rem < 0 then rem = 0 end
return { format('%d', grant), format('%d', wid), format('%d', now), format('%d', reset), format('%d', rem) }
