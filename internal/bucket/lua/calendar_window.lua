-- calendar_window (code 7): at most L units per calendar period (a day, week, month or year
-- beginning at local midnight in a time zone: package calendar), whose instants only the caller
-- can compute (Lua has no time zones). The caller sends two consecutive periods around its own
-- clock (calendar.Period.Around); Redis's clock picks the one that holds it, so a caller whose
-- clock is off by less than half a period counts every check in the period Redis's time is in.
--
-- Keys/arguments: one limit of call.lua (KEYS[i]; ARGV code '7', L, then in the places of the
-- window and the burst:
--   W  the start of the first period, in Unix seconds;
--   B  its length and the second's, in seconds, as first * 2^25 + second (each below 2^25 s,
--      388 days, so B stays below 2^50 and exact);
-- token unused). Redis's time outside both periods is an error ("calendar periods do not hold
-- Redis's time"): the caller's clock is off by half a period or more.
-- State: a hash {w = the period's start in Unix seconds, n = count}, expiring at the period's
-- end: the previous layout of fixed_window (there is one layout: a calendar key is never of
-- another algorithm's key code, "cw").
-- A stored period other than the current one means a count of 0, except a later one (the
-- clock stepped back, or a caller with a clock ahead wrote it), kept as current: its count errs
-- towards denying.
-- Allowed when n + cost <= L. used = n, remaining = L - n. reset = the period's end. Denied:
-- retry = reset - now.
-- Refund: n -= cost when the charge's period (from charge_now) is still the stored one.
-- Commands: HMGET; on commit HSET (+ PEXPIREAT for a new period).
local cw_eval, cw_commit, cw_refund, cw_charge
if NEED_1 == '7' or NEED and NEED['7'] then
  -- cw_period returns the start (Unix s) and the end (µs) of the period of W and B holding t
  -- (µs), or raises the error above.
  local function cw_period(W, B, t)
    local first = floor(B / 33554432)
    local second = B - first * 33554432
    local s1, s2 = W, W + first
    local e2 = s2 + second
    if t >= s2 * 1000000 and t < e2 * 1000000 then
      return s2, e2 * 1000000
    end
    if t >= s1 * 1000000 and t < s2 * 1000000 then
      return s1, s2 * 1000000
    end
    error({err = 'ERR bucket: calendar periods do not hold Redis\'s time'})
  end

  function cw_eval(key, L, W, B, now, cost)
    local wid, reset = cw_period(W, B, now)
    local h = redis.call('HMGET', key, 'w', 'n')
    local sw, n = tonumber(h[1]), tonumber(h[2]) or 0
    local fresh = sw ~= wid
    if sw and sw > wid then
      wid, fresh = sw, false -- a later period: its end is unknown, the current one's stands in
    elseif fresh then
      n = 0
    end
    if n + cost <= L then
      local after = n + cost
      return true, n, nonneg(L - n), reset, after, nonneg(L - after), reset, wid, after, fresh and reset
    end
    return false, n, nonneg(L - n), reset, reset - now, nil, nil, wid, n + cost, fresh and reset
  end

  if MODE ~= '1' then
    function cw_commit(key, L, W, B, now, now_s, cost, Bs, wid, after, ends)
      if ends then
        redis.call('HSET', key, 'w', us(wid), 'n', us(after))
        redis.call('PEXPIREAT', key, us(ceil(ends / 1000)))
        return ''
      end
      redis.call('HSET', key, 'n', us(after))
      return ''
    end
  end

  if REFUNDS then
    function cw_refund(key, L, W, B, now, cost, charge_now, token, Bs)
      local cw = cw_period(W, B, charge_now)
      local h = redis.call('HMGET', key, 'w', 'n')
      if tonumber(h[1]) ~= cw then
        return
      end
      redis.call('HSET', key, 'n', us(nonneg((tonumber(h[2]) or 0) - cost)))
    end
  end
end
