-- fixed_window (code 3): at most L units per window; windows are aligned to the Unix epoch,
-- wid = floor(now / W).
--
-- Keys/arguments: one limit of check.lua (KEYS[i]; ARGV code '3', L, W, B ignored, token
-- unused).
-- State: hash {w = window id, n = count}. A stored w other than the current window means a
-- count of 0; a stored w ahead of the clock (the clock stepped back) is kept as current.
-- Allowed when n + cost <= L. used = n, remaining = L - n.
-- reset = (wid + 1) * W. Denied: retry = reset - now.
-- TTL: PEXPIREAT the end of the window, set when the window is first written: a charge in
-- the window already stored only updates n.
-- Refund: n -= cost when the charge's window (from charge_now) is still the stored one.
-- Commands: HMGET, and on commit HSET (+ PEXPIREAT for a new window).
local fw_eval, fw_commit, fw_refund
if NEED_1 == '3' or NEED and NEED['3'] then
  -- eval: s1 = window id, or false when it is the stored one; s2 = count after consumption.
  function fw_eval(key, L, W, B, now, cost)
    local wid = floor(now / W)
    local t = now
    local v = redis.call('HMGET', key, 'w', 'n')
    local sw = tonumber(v[1])
    local n = 0
    local same = false
    if sw and sw >= wid then
      n = tonumber(v[2]) or 0
      same = true
      if sw > wid then
        wid = sw
        t = sw * W
      end
    end
    local reset = (wid + 1) * W
    if n + cost <= L then
      local after = n + cost
      return true, n, nonneg(L - n), reset, after, nonneg(L - after), reset, not same and wid, after
    end
    return false, n, nonneg(L - n), reset, reset - t
  end

  if MODE ~= '1' then
    function fw_commit(key, L, W, B, now, now_s, cost, Bs, wid, after)
      if not wid then
        redis.call('HSET', key, 'n', us(after))
        return ''
      end
      redis.call('HSET', key, 'w', us(wid), 'n', us(after))
      redis.call('PEXPIREAT', key, us(ceil((wid + 1) * W / 1000)))
      return ''
    end
  end

  if MODE == '2' then
    function fw_refund(key, L, W, B, now, cost, charge_now, token, Bs)
      local cw = floor(charge_now / W)
      local v = redis.call('HMGET', key, 'w', 'n')
      if tonumber(v[1]) ~= cw then
        return
      end
      redis.call('HSET', key, 'n', us(nonneg((tonumber(v[2]) or 0) - cost)))
    end
  end
end
