-- fixed_window (code 3): at most L units per window; windows are aligned to the Unix epoch,
-- wid = floor(now / W).
--
-- Keys/arguments: one limit of call.lua (KEYS[i]; ARGV code '3', L, W, B ignored, token
-- unused).
-- State, in one of three layouts; every version since the compact one reads the first two,
-- and a write uses the configured one (COMPACT, SHARED, --bucket-layout; layout.go),
-- converting the key:
--   previous: hash {w = window id, n = count} (the only layout before; HMGET on the string
--             of the compact layout fails, so a version that knows only this one must not run
--             alongside compact writers).
--   compact:  string "<n * 8 + wid % 8>", an integer, which Redis keeps in the key's object
--             (no allocation at all below 10,000 when no maxmemory LRU/LFU policy is set,
--             else 16 bytes) instead of a 32-48 byte hash. The key expires at the end of its
--             window (PXAT), so a key that exists holds the current window, or one ahead of
--             the clock: the low bits tell them apart, and when they differ from the current
--             window's the expiry names the window exactly, (wid + 1) * W = PEXPIRETIME * 1000
--             rounded up to a ms (unique for W >= 1 ms: shorter windows keep the previous
--             layout). A key 8k windows ahead reads as the current window: it keeps its count,
--             which errs towards denying. n * 8 stays below 2^53 (n <= L <= 2^50).
--   shared:   (SHARED, W >= 1 ms) field key of a shared hash (shared.lua), "<e>|<n>", e the
--             expiry the compact key would have, which names the window as its PEXPIRETIME
--             does. A bucket with no field is read from its key, in either layout above, and
--             moved into its field (the key deleted) by its next charge. The mixed layout
--             (FIELDS) writes compact keys, but a bucket with no key and a field is read and
--             written there.
-- A stored window other than the current one means a count of 0, except a stored window
-- ahead of the clock (the clock stepped back), kept as current.
-- Allowed when n + cost <= L. used = n, remaining = L - n.
-- reset = (wid + 1) * W. Denied: retry = reset - now.
-- TTL: the end of the window, set when the window is first written: a charge in the window
-- already stored only updates n (compact: SET KEEPTTL).
-- Refund: n -= cost when the charge's window (from charge_now) is still the stored one
-- (compact: read from the expiry, as the low bits could match a window 8 later).
-- Commands: GET (compact) or HMGET (previous), then the other on a key of the other layout
-- (WRONGTYPE), and PEXPIRETIME on a compact key of another window; on commit SET KEEPTTL or
-- SET PXAT (compact), HSET (+ PEXPIREAT for a new window; DEL first over a compact key)
-- (previous). Shared: fget first, and the above only when the bucket has no field; fset on
-- commit (+ DEL of a key it was read from).
local fw_eval, fw_commit, fw_refund
if NEED_1 == '3' or NEED and NEED['3'] then
  -- read asks where the bucket lives (shared.lua): a shared writer its field first, a mixed
  -- one its key first, either the other when the first holds nothing. It returns the field's
  -- state v (false when the field has expired, nil when there is none) and expiry e, or the
  -- key's: a compact string s or a previous hash h. (One helper for eval and refund: a library
  -- builds its closure once; a script run pays it per run, only when a fixed window is
  -- checked.)
  local function read(key, W, now)
    local s, h, v, e
    if SHARED and W >= 1000 then
      v, e = fget(key, now)
      if v ~= nil then
        return nil, nil, v, e
      end
    end
    -- Ask first for the configured layout's type: a second call, after a WRONGTYPE error, only
    -- for a key of the other.
    if COMPACT then
      s = redis.pcall('GET', key)
      if type(s) == 'table' then
        s, h = nil, redis.call('HMGET', key, 'w', 'n')
      elseif not s and FIELDS and not SHARED and W >= 1000 then
        v, e = fget(key, now)
      end
    else
      h = redis.pcall('HMGET', key, 'w', 'n')
      if h.err then
        s, h = redis.call('GET', key), nil
      end
    end
    return s, h, v, e
  end

  -- eval: s1 = the window id to write, s2 = count after consumption, s3 = what holds that
  -- window's count already ('h' a hash, 's' a compact string), 'x' a compact string of an older
  -- window, false nothing; or, a number, that its field is to be written (shared.lua): the
  -- field's expiry as read (0 for none), -1 for a shared writer's bucket read from its key.
  function fw_eval(key, L, W, B, now, cost)
    local wid = floor(now / W)
    local t = now
    -- sw: the stored window id (nil for none), n its count, held what holds them.
    local sw, n = nil, 0
    local s, h, v, held = read(key, W, now)
    if v then
      sw, n = floor(held * 1000 / W) - 1, tonumber(v) or 0
    elseif v == false then
      held = 0 -- a field that has expired: an empty bucket, written as a field
    elseif h then
      sw, n, held = tonumber(h[1]), tonumber(h[2]) or 0, 'h'
    elseif s then
      local v = tonumber(s) or 0
      local r = v % 8
      sw, n, held = wid, (v - r) / 8, 's'
      if r ~= wid % 8 then
        local e = redis.call('PEXPIRETIME', key)
        if e >= 0 then -- else no expiry, never written so: keep the count
          sw = floor(e * 1000 / W) - 1
        end
      end
    else
      held = false
    end
    if SHARED and W >= 1000 then
      if held == 'h' or held == 's' then
        held = -1 -- the key it was read from, deleted when its field is written
      elseif not held then
        held = 0
      end
    end
    if sw and sw >= wid then
      if sw > wid then
        wid = sw
        t = sw * W
      end
    elseif held == 's' then
      n, held = 0, 'x'
    else
      n = 0
      if held == 'h' then held = false end
    end
    local reset = (wid + 1) * W
    if n + cost <= L then
      local after = n + cost
      return true, n, nonneg(L - n), reset, after, nonneg(L - after), reset, wid, after, held
    end
    return false, n, nonneg(L - n), reset, reset - t, nil, nil, wid, n + cost, held
  end

  if MODE ~= '1' then
    function fw_commit(key, L, W, B, now, now_s, cost, Bs, wid, after, held)
      if type(held) == 'number' then
        if held == -1 then
          redis.call('DEL', key)
          held = 0
        end
        fset(key, us(after), ceil((wid + 1) * W / 1000), held, now)
        return ''
      end
      if COMPACT and W >= 1000 then
        local v = us(after * 8 + wid % 8)
        if held == 's' then
          redis.call('SET', key, v, 'KEEPTTL')
        else
          redis.call('SET', key, v, 'PXAT', us(ceil((wid + 1) * W / 1000)))
        end
        return ''
      end
      if held == 'h' then
        redis.call('HSET', key, 'n', us(after))
        return ''
      end
      if held then -- a compact string, which HSET cannot write over
        redis.call('DEL', key)
      end
      redis.call('HSET', key, 'w', us(wid), 'n', us(after))
      redis.call('PEXPIREAT', key, us(ceil((wid + 1) * W / 1000)))
      return ''
    end
  end

  if REFUNDS then
    function fw_refund(key, L, W, B, now, cost, charge_now, token, Bs)
      local cw = floor(charge_now / W)
      local s, h, v, e = read(key, W, now)
      if v then -- its field: refunded there
        if floor(e * 1000 / W) - 1 == cw then
          fset(key, us(nonneg((tonumber(v) or 0) - cost)), e, e, now)
        end
        return
      elseif v == false then -- a field that has expired: nothing to give back
        return
      end
      -- its key (or nothing): refunded there, in its layout
      if h then
        if tonumber(h[1]) ~= cw then
          return
        end
        redis.call('HSET', key, 'n', us(nonneg((tonumber(h[2]) or 0) - cost)))
        return
      end
      if not s then
        return
      end
      if floor(redis.call('PEXPIRETIME', key) * 1000 / W) - 1 ~= cw then
        return
      end
      local v = tonumber(s) or 0
      local r = v % 8
      redis.call('SET', key, us(nonneg((v - r) / 8 - cost) * 8 + r), 'KEEPTTL')
    end
  end
end
