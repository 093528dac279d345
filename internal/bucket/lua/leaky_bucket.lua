-- leaky_bucket (code 2), as a meter: a level that leaks L units per W µs, holding at most B.
--
-- State: hash {lv = level (float), ts = µs of the last update}. A missing key is empty.
-- Allowed when level + cost <= B. used = ceil(level), remaining = floor(B - level).
-- Denied: retry = ceil((level + cost - B) * W / L). reset = when the level reaches 0.
-- TTL: until the level reaches 0, when a missing key means the same.
-- Refund: level = max(0, level - cost).
ALG[2] = function()
  local M = {}

  local function load(key, p, now)
    local v = redis.call('HMGET', key, 'lv', 'ts')
    local lv = tonumber(v[1])
    if not lv then
      return 0, now
    end
    local ts = tonumber(v[2]) or now
    local t = now
    if ts > t then t = ts end
    lv = nonneg(lv - (t - ts) * p.limit / p.window)
    return lv, t
  end

  local function write(key, p, t, now, lv)
    redis.call('HSET', key, 'lv', num(lv), 'ts', us(t))
    redis.call('PEXPIRE', key, ttl_ms(t - now + lv * p.window / p.limit))
  end

  local function meter(p, t, lv)
    return nonneg(ceil_t(lv)), nonneg(floor_t(p.burst - lv)), t + lv * p.window / p.limit
  end

  function M.eval(key, p, now, cost)
    local lv, t = load(key, p, now)
    local r = {t = t}
    r.used, r.rem, r.reset = meter(p, t, lv)
    if le(lv + cost, p.burst) then
      r.ok = true
      r.after = lv + cost
      r.aused, r.arem, r.areset = meter(p, t, r.after)
    else
      r.ok = false
      r.retry = ceil_us((lv + cost - p.burst) * p.window / p.limit)
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
    local lv, t = load(key, p, now)
    lv = nonneg(lv - cost)
    if lv <= tol(0) then
      redis.call('DEL', key)
      return
    end
    write(key, p, t, now, lv)
  end

  return M
end
