-- sliding_window_counter (code 5): the previous window's count weighted by how much of it
-- still overlaps the sliding window, plus the current window's count. Windows are aligned to
-- the epoch, wid = floor(now / W), pos = (now - wid * W) / W in [0, 1).
--
-- State: hash {w = window id, c = current window count, p = previous window count}. When the
-- window advanced by exactly 1, p = c and c = 0; by more, both are 0. A stored w ahead of the
-- clock (the clock stepped back) is kept as current.
-- weighted = p * (1 - pos) + c. Allowed when weighted + cost <= L (commit: c += cost).
-- used = ceil(weighted), remaining = floor(L - weighted).
-- Denied: retry = until weighted drops to L - cost: within this window when c + cost <= L,
-- else in the next one (p' = c, c' = 0). reset = when weighted reaches 0.
-- TTL: PEXPIREAT the end of the next window (at most 2 W), when both counts are 0 anyway.
-- Refund: cost comes off the count of the charge's window (from charge_now) when that window
-- is still the current or the previous one.
ALG[5] = function()
  local M = {}

  local function load(key, p, now)
    local W = p.window
    local wid = math.floor(now / W)
    local t = now
    local c, pv = 0, 0
    local v = redis.call('HMGET', key, 'w', 'c', 'p')
    local sw = tonumber(v[1])
    if sw then
      local sc, sp = tonumber(v[2]) or 0, tonumber(v[3]) or 0
      if sw >= wid then
        c, pv = sc, sp
        if sw > wid then
          wid = sw
          t = sw * W
        end
      elseif sw == wid - 1 then
        pv = sc
      end
    end
    return wid, c, pv, t, sw ~= nil
  end

  local function state(p, wid, c, pv, t)
    local W = p.window
    local pos = (t - wid * W) / W
    local weighted = pv * (1 - pos) + c
    local reset = t
    if c > 0 then
      reset = (wid + 2) * W
    elseif pv > 0 then
      reset = (wid + 1) * W
    end
    return nonneg(ceil_t(weighted)), nonneg(floor_t(p.limit - weighted)), reset, weighted
  end

  local function write(key, p, wid, c, pv)
    redis.call('HSET', key, 'w', us(wid), 'c', us(c), 'p', us(pv))
    redis.call('PEXPIREAT', key, us(math.ceil((wid + 2) * p.window / 1000)))
  end

  function M.eval(key, p, now, cost)
    local W, L = p.window, p.limit
    local wid, c, pv, t = load(key, p, now)
    local r = {wid = wid, c = c, pv = pv, t = t}
    local weighted
    r.used, r.rem, r.reset, weighted = state(p, wid, c, pv, t)
    if le(weighted + cost, L) then
      r.ok = true
      r.aused, r.arem, r.areset = state(p, wid, c + cost, pv, t)
      return r
    end
    r.ok = false
    local target = L - cost
    local at
    if le(c + cost, L) and pv > 0 then
      -- pv * (1 - pos) + c = target within this window.
      at = wid * W + W * (1 - (target - c) / pv)
    elseif target >= 0 and c > 0 then
      -- c * (1 - pos') = target in the next window.
      at = (wid + 1) * W + W * (1 - target / c)
    else
      at = r.reset
    end
    r.retry = ceil_us(at - t)
    return r
  end

  function M.commit(key, p, now, cost, r)
    write(key, p, r.wid, r.c + cost, r.pv)
    return ''
  end

  function M.refund(key, p, now, cost, charge_now, token)
    local wid, c, pv, t, found = load(key, p, now)
    if not found then
      return
    end
    local cw = math.floor(charge_now / p.window)
    if cw == wid then
      c = nonneg(c - cost)
    elseif cw == wid - 1 then
      pv = nonneg(pv - cost)
    else
      return
    end
    write(key, p, wid, c, pv)
  end

  return M
end
