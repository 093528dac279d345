-- fixed_window (code 3): at most L units per window; windows are aligned to the Unix epoch,
-- wid = floor(now / W).
--
-- State: hash {w = window id, n = count}. A stored w other than the current window means a
-- count of 0; a stored w ahead of the clock (the clock stepped back) is kept as current.
-- Allowed when n + cost <= L. used = n, remaining = L - n.
-- reset = (wid + 1) * W. Denied: retry = reset - now.
-- TTL: PEXPIREAT the end of the window.
-- Refund: n -= cost when the charge's window (from charge_now) is still the stored one.
ALG[3] = function()
  local M = {}

  local function load(key, p, now)
    local W = p.window
    local wid = math.floor(now / W)
    local t = now
    local v = redis.call('HMGET', key, 'w', 'n')
    local sw = tonumber(v[1])
    local n = 0
    if sw and sw >= wid then
      n = tonumber(v[2]) or 0
      if sw > wid then
        wid = sw
        t = sw * W
      end
    end
    return wid, n, t
  end

  function M.eval(key, p, now, cost)
    local L = p.limit
    local wid, n, t = load(key, p, now)
    local reset = (wid + 1) * p.window
    local r = {wid = wid, t = t, used = n, rem = nonneg(L - n), reset = reset}
    if n + cost <= L then
      r.ok = true
      r.after = n + cost
      r.aused, r.arem, r.areset = r.after, nonneg(L - r.after), reset
    else
      r.ok = false
      r.retry = reset - t
    end
    return r
  end

  function M.commit(key, p, now, cost, r)
    redis.call('HSET', key, 'w', us(r.wid), 'n', us(r.after))
    redis.call('PEXPIREAT', key, us(math.ceil(r.reset / 1000)))
    return ''
  end

  function M.refund(key, p, now, cost, charge_now, token)
    local cw = math.floor(charge_now / p.window)
    local v = redis.call('HMGET', key, 'w', 'n')
    if tonumber(v[1]) ~= cw then
      return
    end
    redis.call('HSET', key, 'n', us(nonneg((tonumber(v[2]) or 0) - cost)))
  end

  return M
end
