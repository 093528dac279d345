-- leaky_bucket (code 2), as a meter: a level that leaks L units per W µs, holding at most B.
--
-- Keys/arguments: one limit of call.lua (KEYS[i]; ARGV code '2', L, W, B, token: "" or, for a
-- queue, D, the longest delay in µs).
-- State: hash {lv = level (float), ts = µs of the last update}. A missing key is empty.
-- Allowed when level + cost <= B, or for a queue (a leaky bucket used as one) when the level
-- above B drains within D: (level + cost - B) * W / L <= D, the charge's delay, which the
-- caller reads as reset - now - B * W / L. used = ceil(level), remaining = floor(B - level).
-- Denied: retry = ceil((level + cost - B) * W / L - D), D = 0 but for a queue. reset = when
-- the level reaches 0.
-- TTL: until the level reaches 0, when a missing key means the same.
-- Refund: level = max(0, level - cost).
-- Commands: HMGET, and on commit HSET + PEXPIRE.
local lb_eval, lb_commit, lb_refund, lb_charge
if NEED_1 == '2' or NEED and NEED['2'] then
  -- load returns the level at t = max(now, ts), leaked.
  local function load(key, L, W, now)
    local v = redis.call('HMGET', key, 'lv', 'ts')
    local lv = tonumber(v[1])
    if not lv then
      return 0, now
    end
    local ts = tonumber(v[2]) or now
    local t = now
    if ts > t then t = ts end
    lv = nonneg(lv - (t - ts) * L / W)
    return lv, t
  end

  -- eval: s1 = t, s2 = level after consumption.
  function lb_eval(key, L, W, B, now, cost, Bs, D)
    local lv, t = load(key, L, W, now)
    local used, rem, reset = ceil_nn(lv), floor_nn(B - lv), t + lv * W / L
    local q = tonumber(D) or 0
    if le(lv + cost, B) or q > 0 and le((lv + cost - B) * W / L, q) then
      local after = lv + cost
      return true, used, rem, reset, ceil_nn(after), floor_nn(B - after), t + after * W / L, t, after
    end
    return false, used, rem, reset, ceil_us((lv + cost - B) * W / L - q), nil, nil, t, lv + cost
  end

  -- commit writes level lv at t; refund reuses it.
  if MODE ~= '1' then
    function lb_commit(key, L, W, B, now, now_s, cost, Bs, t, lv)
      local ts = now_s
      if t ~= now then ts = us(t) end
      redis.call('HSET', key, 'lv', num(lv), 'ts', ts)
      redis.call('PEXPIRE', key, ttl_ms(t - now + lv * W / L))
      return ''
    end
  end

  if REFUNDS then
    function lb_refund(key, L, W, B, now, cost, charge_now, token, Bs)
      if redis.call('EXISTS', key) == 0 then
        return
      end
      local lv, t = load(key, L, W, now)
      lv = nonneg(lv - cost)
      if lv <= 1e-9 then
        redis.call('DEL', key)
        return
      end
      lb_commit(key, L, W, B, now, us(now), cost, Bs, t, lv)
    end
  end
end
