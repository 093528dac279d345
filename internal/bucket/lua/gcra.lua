-- gcra (code 6): the generic cell rate algorithm. T = W / L (emission interval), tau = B * T.
--
-- State: string key holding the theoretical arrival time TAT in µs, written as
-- "<integer µs>.<9 fraction digits>": T is rarely an integer and a double near 1.7e15 has only
-- 0.25 µs of resolution, so the fraction is kept apart and all arithmetic is done on
-- diff = TAT - now, a small number. A missing key means TAT = now.
-- tat = max(TAT, now), new_tat = tat + cost * T. Allowed when new_tat - now <= tau.
-- remaining = floor((tau - (tat - now)) / T), after consumption when allowed; used = B - remaining.
-- Denied: retry = new_tat - now - tau. reset = new_tat (tat when denied).
-- TTL: until TAT, after which a missing key means the same.
-- Refund: TAT -= cost * T; the key is deleted when that is not after now.
ALG[6] = function()
  local M = {}

  local function load(key, now)
    local s = redis.call('GET', key)
    if not s then
      return 0
    end
    local dot = string.find(s, '.', 1, true)
    local diff
    if dot then
      diff = (tonumber(string.sub(s, 1, dot - 1)) - now) + tonumber(string.sub(s, dot + 1)) / 1e9
    else
      diff = tonumber(s) - now
    end
    return nonneg(diff)
  end

  local function write(key, now, diff)
    local ip = math.floor(diff)
    local f9 = math.floor((diff - ip) * 1e9 + 0.5)
    if f9 >= 1e9 then
      ip = ip + 1
      f9 = 0
    end
    redis.call('SET', key, string.format('%.0f.%09d', now + ip, f9), 'PX', ttl_ms(diff))
  end

  local function state(p, now, T, tau, diff)
    local rem = nonneg(floor_t((tau - diff) / T))
    if rem > p.burst then rem = p.burst end
    return p.burst - rem, rem, now + diff
  end

  function M.eval(key, p, now, cost)
    local T = p.window / p.limit
    local tau = p.burst * T
    local diff = load(key, now)
    local nd = diff + cost * T
    local r = {nd = nd}
    r.used, r.rem, r.reset = state(p, now, T, tau, diff)
    if le(nd, tau) then
      r.ok = true
      r.aused, r.arem, r.areset = state(p, now, T, tau, nd)
    else
      r.ok = false
      r.retry = ceil_us(nd - tau)
    end
    return r
  end

  function M.commit(key, p, now, cost, r)
    write(key, now, r.nd)
    return ''
  end

  function M.refund(key, p, now, cost, charge_now, token)
    local diff = load(key, now) - cost * p.window / p.limit
    if diff <= tol(0) then
      redis.call('DEL', key)
      return
    end
    write(key, now, diff)
  end

  return M
end
