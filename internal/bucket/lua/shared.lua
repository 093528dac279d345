-- shared: the buckets of the shared layout (SHARED, --bucket-layout shared; layout.go) are
-- fields of Redis hashes that many buckets share, so that a bucket costs Redis an entry of a
-- hash's listpack (about 50 bytes) instead of a key of its own (about 117 bytes before its
-- value: docs/performance.md, "Redis memory per bucket").
--
-- Which: the buckets of fixed_window (W >= 1 ms), gcra and token_bucket, whose modules say how
-- they use fget and fset; the other algorithms keep a key each, written as in the compact
-- layout, and so do fixed windows shorter than 1 ms.
-- Where: bucket key k is field k of the hash the call's KEYS give beside it (call.lua: one per
-- limit, after the limits and the record), which Store names (shared.go) "rl:{<tag>}:h<j>" in
-- k's cluster slot, so that a call's keys stay in one slot.
-- Field k: "<expiry ms>|<state>", state the module's compact state and the expiry what the key
--   of the compact layout would have had (gcra and token_bucket round it up to a second, so
--   that most writes keep it: no format, no look at "~"): the field reads as missing once the
--   clock (in ms) is past it, as Redis's key would, since a hash's field has no TTL of its own
--   in Redis 7.0.
-- Field "~": the hash's expiry (ms), at least every field's (when a write would pass it, it
--   becomes that field's plus SLACK, and the hash is given it as its TTL): a hash whose
--   buckets all go idle expires as their keys would have, SLACK later.
-- Sweeping: a field that has expired stays until a write sweeps its hash (deletes the
--   fields that have expired): a write that moves "~" (at most one per hash per SLACK while
--   its buckets are busy, but none while a long window keeps "~" ahead), and one in 16 writes
--   that create a field (or write over one that had expired), so that a hash holds about 16
--   expired fields, besides those of buckets that stay idle, whose hash expires.
-- Where a bucket lives: in its field or in its key, never both, so that shared and mixed
--   writers (a rolling switch between them, either way) share every count. Once a bucket has
--   a field (live or expired), it is written there; a key is written only while it has none.
--   A shared writer asks the field first and, when there is none, the key (written in another
--   layout, or by a version before this one), whose state its next write moves into the field,
--   deleting the key. A mixed writer (FIELDS but not SHARED: the compact layout's keys) asks
--   the key first and, when there is none, the field, and writes the field when there is one,
--   else its key. A field that has expired is an empty bucket, as a missing key is; a sweep
--   deletes it, after which either writer finds none. The previous and compact layouts read
--   no fields (layout.go): a field read on every missing key costs the check a call.
-- Commands: HGET of the field (fget); HSET (fset), with HGET of "~" when the write moves the
--   field's expiry, and PEXPIRE of the hash, HGETALL and HDEL when "~" moves.
--
-- HASH is the hash of the limit being decided, set by the drivers (call.lua, batch.lua) before
-- each call of its module's eval, commit or refund; the mixed and shared layouts' calls name
-- their limits' hashes (call.lua's KEYS).
local HASH
local fget, fset
if FIELDS then
  -- SLACK (ms) is how far past its latest field's expiry a hash's "~" is moved: "~" moves, and
  -- its hash is swept, at most once per SLACK while its buckets are busy.
  local SLACK = 60000
  -- HX_HASH is the hash whose "~" was read last in this call, HXS that "~" (a string, parsed
  -- when a write needs it; false when the hash has none).
  local HX_HASH, HXS
  -- FK is the field fget read last with a live state, FES its expiry as text.
  local FK, FES
  -- CREATED counts the fields fset created (or wrote over an expired one) in this run, or in
  -- a library's life: one in 16 sweeps its hash, those whose count plus the run's time (µs)
  -- is a multiple of 16 (a script's runs each start the count over).
  local CREATED = 0

  -- fget returns the state field key of HASH holds and its expiry (ms); nil when there is no
  -- such field, when the bucket may still be in key itself (another layout's); false and 0
  -- when the field has expired (or is malformed), which means an empty bucket, as a missing
  -- key does.
  function fget(key, now)
    local v = redis.call('HGET', HASH, key)
    HX_HASH = nil -- "~" is read afresh by this call's first write that needs it
    if not v then
      return nil
    end
    local bar = string.find(v, '|', 1, true)
    local es = bar and string.sub(v, 1, bar - 1)
    local e = tonumber(es)
    if not e or floor(now / 1000) > e then
      return false, 0
    end
    FK, FES = key, es
    return string.sub(v, bar + 1), e
  end

  -- sweep deletes the fields of HASH that have expired at now (µs), by HDELs of at most 1,000
  -- fields (unpack's arguments must fit Lua's C stack, which an oversized hash would pass).
  local function sweep(now)
    local all = redis.call('HGETALL', HASH)
    local ms = floor(now / 1000)
    local gone, k = {'HDEL', HASH}, 2
    for i = 1, #all, 2 do
      local f, v = all[i], all[i + 1]
      if f ~= '~' then
        local bar = string.find(v, '|', 1, true)
        local e = bar and tonumber(string.sub(v, 1, bar - 1))
        if not e or ms > e then
          k = k + 1
          gone[k] = f
          if k == 1002 then
            redis.call(unpack(gone))
            gone, k = {'HDEL', HASH}, 2
          end
        end
      end
    end
    if k > 2 then
      redis.call(unpack(gone))
    end
  end

  -- fset writes state into field key of HASH, expiring at e (ms). old is the field's expiry as
  -- fget read it (0 when unknown): every field's expiry is at most "~", so a write that keeps
  -- it (the same window) needs no look at "~".
  function fset(key, state, e, old, now)
    local v
    if e == old and key == FK then
      v = FES .. '|' .. state -- the expiry as read: no format
    else
      v = format('%d', e) .. '|' .. state
    end
    if e <= old then
      redis.call('HSET', HASH, key, v)
      return
    end
    if HX_HASH ~= HASH then
      HX_HASH, HXS = HASH, redis.call('HGET', HASH, '~')
    end
    local hx = tonumber(HXS) or 0
    if e <= hx then
      redis.call('HSET', HASH, key, v)
      if old == 0 then
        CREATED = CREATED + 1
        if (now + CREATED) % 16 == 0 then
          sweep(now)
        end
      end
      return
    end
    local swept = HXS -- a hash with no "~" is new: nothing to sweep
    hx = e + SLACK
    HXS = format('%d', hx)
    redis.call('HSET', HASH, key, v, '~', HXS)
    -- A TTL from now, not PEXPIREAT: now is Redis's clock plus SHIFT (scripts.go).
    redis.call('PEXPIRE', HASH, format('%d', hx - floor(now / 1000)))
    if swept then
      sweep(now)
    end
  end
end
