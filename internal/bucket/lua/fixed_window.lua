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
-- commit (+ DEL of a key it was read from). A batch's one-limit charge in the compact layout
-- (fw_charge): one INCRBY, with SET PXAT after it for the window's first charge.
local fw_eval, fw_commit, fw_refund, fw_charge
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

  -- fw_charge charges cost to the compact bucket of a batch's quick call of one limit
  -- (batch.lua) by one INCRBY instead of a GET and a SET: the count is the value's high bits,
  -- so adding cost * 8 (c8, as a string) counts the charge and keeps the window's low bits and
  -- the key's expiry, exactly what fw_commit's SET KEEPTTL would write. What INCRBY returns
  -- says whether that was right:
  --   the value before was 0: a new key (INCRBY made it, with no expiry) or a count of 0, the
  --     window's first charge: SET PXAT writes its value and expiry as fw_commit does (a count
  --     of 0 of a window ahead of the clock becomes the current window's: nothing is lost);
  --   its low bits name another window (the clock stepped back): undone by DECRBY, for the
  --     general path (eval reads the window from the expiry);
  --   the count after it is above L: undone by DECRBY, denied as eval denies it;
  --   the value is 2^53 or more (a count near 2^50, kept from a larger limit, plus the
  --     charge), which a Lua number does not hold exactly: undone by DECRBY (Redis adds
  --     exactly), for the general path.
  -- A cost above L (it never fits), a window under 1 ms (the previous layout) and a key INCRBY
  -- cannot add to (a hash of the previous layout, WRONGTYPE; or of a slot this node does not
  -- serve, whose error the general path raises) go to the general path, changed by nothing:
  -- it returns nil then. Else it returns 1 and used, remaining, reset when allowed, or 0,
  -- used, remaining, reset and retry (µs) when denied, as eval's would be.
  -- Only the pure compact layout has it: the mixed one reads fields when a key is missing.
  if COMPACT and not FIELDS and BATCH then
    function fw_charge(key, L, W, now, cost, c8)
      if cost > L or W < 1000 then
        return nil
      end
      local v = redis.pcall('INCRBY', key, c8)
      if type(v) ~= 'number' then
        return nil
      end
      if v >= 9007199254740992 then
        redis.call('DECRBY', key, c8)
        return nil
      end
      local wid = floor(now / W)
      local reset = (wid + 1) * W
      local before = v - cost * 8
      if before == 0 then
        redis.call('SET', key, us(cost * 8 + wid % 8), 'PXAT', us(ceil(reset / 1000)))
        return 1, cost, L - cost, reset
      end
      local r = before % 8
      if r ~= wid % 8 then
        redis.call('DECRBY', key, c8)
        return nil
      end
      local after = (v - r) / 8
      if after <= L then
        return 1, after, L - after, reset
      end
      redis.call('DECRBY', key, c8)
      local n = after - cost
      return 0, n, nonneg(L - n), reset, reset - now
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
