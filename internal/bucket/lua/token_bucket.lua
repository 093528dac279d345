-- token_bucket (code 1): a bucket of B tokens refilled at L tokens per W µs.
--
-- Keys/arguments: one limit of call.lua (KEYS[i]; ARGV code '1', L, W, B, token unused).
-- State: tk = tokens (float), ts = µs of the last update, cap = B it was written with, in one
-- of three layouts; every version since the compact one reads the first two, and a write uses
-- the configured one (COMPACT, SHARED, --bucket-layout; layout.go), converting the key:
--   previous: hash {tk, ts, cap} (the only layout before; HMGET on the string of the compact
--             layout fails, so a version that knows only this one must not run alongside
--             compact writers).
--   compact:  string "<tk>:<ts>:<cap>", the same numbers as the same text: 48 bytes of
--             string where the hash takes 64 (80 once tk has a fraction), and one SET PX to
--             write instead of HSET + PEXPIRE.
--   shared:   (SHARED) field key of a shared hash (shared.lua), "<e>|<tk>:<ts>:<cap>", e the
--             expiry the compact key would have, rounded up to a second. A bucket with no
--             field is read from its key, in either layout above, and moved into its field
--             (the key deleted) by its next write. The mixed layout (FIELDS) writes compact
--             keys, but a bucket with no key and a field is read and written there.
-- A missing key is a full bucket. When cap differs from B (an admin changed the limit) the
-- tokens shift by B - cap, clamped to [0, B], so consumption survives the change: 90 used of
-- 100 raised to 200 leaves 110.
-- Allowed when tokens >= cost. remaining = floor(tokens), used = B - remaining.
-- Denied: retry = ceil((cost - tokens) * W / L). reset = now + (B - tokens) * W / L.
-- TTL: until the bucket is full again, when a missing key means the same.
-- Refund: tokens = min(B, tokens + cost).
-- Commands: GET (compact) or HMGET (previous), then the other on a key of the other layout
-- (WRONGTYPE); on commit SET PX (compact) or HSET + PEXPIRE (previous;
-- DEL first over a compact key). Shared: fget first, and the above only when the bucket has
-- no field; fset on commit (+ DEL of a key it was read from).
local tb_eval, tb_commit, tb_refund, tb_charge
if NEED_1 == '1' or NEED and NEED['1'] then
  -- load returns the tokens at t = max(now, ts), refilled and adjusted to B, and what holds
  -- the state: 's' a compact string, true a hash whose cap is B already, false anything else
  -- (a hash of another cap, no key); or, a number, that its field is to be written
  -- (shared.lua): the field's expiry as read (0 for none), or -1 for a shared writer's bucket
  -- read from its key. A shared writer asks the field first, a mixed one the key first;
  -- either reads the other when the first holds nothing (shared.lua).
  local function load(key, L, W, B, Bs, now)
    local s, v, e
    if SHARED then
      s, e = fget(key, now)
    end
    if s == nil then
      -- Ask first for the configured layout's type: a second call, after a WRONGTYPE error,
      -- only for a key of the other.
      if COMPACT then
        s = redis.pcall('GET', key)
        if type(s) == 'table' then
          s, v = nil, redis.call('HMGET', key, 'tk', 'ts', 'cap')
        end
      else
        v = redis.pcall('HMGET', key, 'tk', 'ts', 'cap')
        if v.err then
          s, v = redis.call('GET', key), nil
        end
      end
      if SHARED then
        e = (s or v and v[1]) and -1 or 0
      elseif FIELDS and not s and not v then
        s, e = fget(key, now)
        if s == false then
          return B, now, 0
        elseif s == nil then
          e = nil
        end
      end
    end
    local tk, ts, cs, held
    if v then
      tk, ts, cs = tonumber(v[1]), tonumber(v[2]), v[3]
      if not tk then
        return B, now, SHARED and 0 or false
      end
      held = cs == Bs -- strings compare by identity
    elseif s then
      local a = string.find(s, ':', 1, true) or #s + 1
      local b = string.find(s, ':', a + 1, true) or #s + 1
      tk, ts, cs = tonumber(string.sub(s, 1, a - 1)) or B, tonumber(string.sub(s, a + 1, b - 1)), string.sub(s, b + 1)
      held = 's'
    else
      return B, now, SHARED and 0 or false
    end
    if e then
      held = e
    end
    ts = ts or now
    local cap = B
    if cs ~= Bs then cap = tonumber(cs) or B end
    if cap ~= B then
      tk = tk + (B - cap)
      if tk < 0 then tk = 0 end
      if tk > B then tk = B end
    end
    local t = now
    if ts > t then t = ts end
    tk = tk + (t - ts) * L / W
    if tk > B then tk = B end
    return tk, t, held
  end

  -- eval: s1 = t, s2 = tokens after consumption, s3 = what holds the state (load's third
  -- result). A denial returns them too (tokens below 0): a settle forces its charge (call.lua).
  function tb_eval(key, L, W, B, now, cost, Bs)
    local tk, t, held = load(key, L, W, B, Bs, now)
    local rem = floor_nn(tk)
    local reset = t + (B - tk) * W / L
    if le(cost, tk) then
      local after = tk - cost
      if after < 0 then after = 0 end
      local arem = floor_nn(after)
      return true, B - rem, rem, reset, B - arem, arem, t + (B - after) * W / L, t, after, held
    end
    return false, B - rem, rem, reset, ceil_us((cost - tk) * W / L), nil, nil, t, tk - cost, held
  end

  -- commit writes tk tokens at t (previous layout: cap too unless the hash has it); refund
  -- reuses it.
  if MODE ~= '1' then
    function tb_commit(key, L, W, B, now, now_s, cost, Bs, t, tk, held)
      local ts = now_s
      if t ~= now then ts = us(t) end
      if type(held) == 'number' then
        if held == -1 then
          redis.call('DEL', key)
          held = 0
        end
        -- Full again then, rounded up to a second: a later write mostly keeps it (shared.lua).
        fset(key, num(tk) .. ':' .. ts .. ':' .. Bs, ceil((t + (B - tk) * W / L) / 1e6 + 1e-9) * 1000, held, now)
        return ''
      end
      local ttl = ttl_ms(t - now + (B - tk) * W / L)
      if COMPACT then
        redis.call('SET', key, num(tk) .. ':' .. ts .. ':' .. Bs, 'PX', ttl)
        return ''
      end
      if held == true then
        redis.call('HSET', key, 'tk', num(tk), 'ts', ts)
      else
        if held then -- a compact string, which HSET cannot write over
          redis.call('DEL', key)
        end
        redis.call('HSET', key, 'tk', num(tk), 'ts', ts, 'cap', Bs)
      end
      redis.call('PEXPIRE', key, ttl)
      return ''
    end
  end

  if REFUNDS then
    function tb_refund(key, L, W, B, now, cost, charge_now, token, Bs)
      -- Nothing stored is a full bucket: nothing to give back. (A compact writer's bucket
      -- may be a field in the mixed layout: shared.lua.)
      if not SHARED and redis.call('EXISTS', key) == 0 and not (FIELDS and fget(key, now)) then
        return
      end
      local tk, t, held = load(key, L, W, B, Bs, now)
      if held == 0 then -- shared: nothing stored, a full bucket
        return
      end
      tk = tk + cost
      if tk > B then tk = B end
      tb_commit(key, L, W, B, now, us(now), cost, Bs, t, tk, held)
    end
  end
end
