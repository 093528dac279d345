-- token_bucket (code 1): a bucket of B tokens refilled at L tokens per W µs.
--
-- State: hash {tk = tokens (float), ts = µs of the last update, cap = B it was written with}.
-- A missing key is a full bucket. When cap differs from B (an admin changed the limit) the
-- tokens shift by B - cap, clamped to [0, B], so consumption survives the change: 90 used of
-- 100 raised to 200 leaves 110.
-- Allowed when tokens >= cost. remaining = floor(tokens), used = B - remaining.
-- Denied: retry = ceil((cost - tokens) * W / L). reset = now + (B - tokens) * W / L.
-- TTL: until the bucket is full again, when a missing key means the same.
-- Refund: tokens = min(B, tokens + cost).
ALG[1] = function()
  local M = {}

  local function load(key, p, now)
    local v = redis.call('HMGET', key, 'tk', 'ts', 'cap')
    local B = p.burst
    local tk = tonumber(v[1])
    if not tk then
      return B, now
    end
    local ts = tonumber(v[2]) or now
    local cap = tonumber(v[3]) or B
    if cap ~= B then
      tk = tk + (B - cap)
      if tk < 0 then tk = 0 end
      if tk > B then tk = B end
    end
    local t = now
    if ts > t then t = ts end
    tk = tk + (t - ts) * p.limit / p.window
    if tk > B then tk = B end
    return tk, t
  end

  local function write(key, p, t, now, tk)
    redis.call('HSET', key, 'tk', num(tk), 'ts', us(t), 'cap', us(p.burst))
    redis.call('PEXPIRE', key, ttl_ms(t - now + (p.burst - tk) * p.window / p.limit))
  end

  local function fill(p, t, tk)
    local rem = nonneg(floor_t(tk))
    return p.burst - rem, rem, t + (p.burst - tk) * p.window / p.limit
  end

  function M.eval(key, p, now, cost)
    local tk, t = load(key, p, now)
    local r = {t = t}
    r.used, r.rem, r.reset = fill(p, t, tk)
    if le(cost, tk) then
      r.ok = true
      r.after = nonneg(tk - cost)
      r.aused, r.arem, r.areset = fill(p, t, r.after)
    else
      r.ok = false
      r.retry = ceil_us((cost - tk) * p.window / p.limit)
    end
    return r
  end

  function M.commit(key, p, now, cost, r)
    write(key, p, r.t, now, r.after)
    return ''
  end

  function M.refund(key, p, now, cost, charge_now, token)
    if redis.call('EXISTS', key) == 0 then
      return
    end
    local tk, t = load(key, p, now)
    tk = tk + cost
    if tk > p.burst then tk = p.burst end
    write(key, p, t, now, tk)
  end

  return M
end
