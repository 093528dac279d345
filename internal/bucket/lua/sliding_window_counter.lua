-- sliding_window_counter (code 5): the previous window's count weighted by how much of it
-- still overlaps the sliding window, plus the current window's count. Windows are aligned to
-- the epoch, wid = floor(now / W), pos = (now - wid * W) / W in [0, 1).
--
-- Keys/arguments: one limit of call.lua (KEYS[i]; ARGV code '5', L, W, B ignored, token
-- unused).
-- State: hash {w = window id, c = current window count, p = previous window count}. When the
-- window advanced by exactly 1, p = c and c = 0; by more, both are 0. A stored w ahead of the
-- clock (the clock stepped back) is kept as current.
-- weighted = p * (1 - pos) + c. Allowed when weighted + cost <= L (commit: c += cost).
-- used = ceil(weighted), remaining = floor(L - weighted).
-- Denied: retry = until weighted drops to L - cost: within this window when c + cost <= L,
-- else in the next one (p' = c, c' = 0). reset = when weighted reaches 0.
-- TTL: PEXPIREAT the end of the next window (at most 2 W), when both counts are 0 anyway; set
-- when a window is first written: a charge in the window already stored only updates c.
-- Refund: cost comes off the count of the charge's window (from charge_now) when that window
-- is still the current or the previous one.
-- Commands: HMGET, and on commit HSET (+ PEXPIREAT for a new window).
local swc_eval, swc_commit, swc_refund, swc_charge
if NEED_1 == '5' or NEED and NEED['5'] then
  local function load(key, W, now)
    local wid = floor(now / W)
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
    return wid, c, pv, t, sw ~= nil, sw ~= nil and sw >= wid
  end

  -- weighted returns the weighted count and the reset time of counts c and pv.
  local function weighted(W, wid, c, pv, t)
    local reset = t
    if c > 0 then
      reset = (wid + 2) * W
    elseif pv > 0 then
      reset = (wid + 1) * W
    end
    return pv * (1 - (t - wid * W) / W) + c, reset
  end

  -- eval: s1 = window id, or false when it is the stored one; s2 = current count after
  -- consumption; s3 = previous count.
  function swc_eval(key, L, W, B, now, cost)
    local wid, c, pv, t, _, same = load(key, W, now)
    local wt, reset = weighted(W, wid, c, pv, t)
    local used, rem = ceil_nn(wt), floor_nn(L - wt)
    if le(wt + cost, L) then
      local awt, areset = weighted(W, wid, c + cost, pv, t)
      return true, used, rem, reset, ceil_nn(awt), floor_nn(L - awt), areset, not same and wid, c + cost, pv
    end
    local target = L - cost
    local at
    if le(c + cost, L) and pv > 0 then
      -- pv * (1 - pos) + c = target within this window.
      at = wid * W + W * (1 - (target - c) / pv)
    elseif target >= 0 and c > 0 then
      -- c * (1 - pos') = target in the next window.
      at = (wid + 1) * W + W * (1 - target / c)
    else
      at = reset
    end
    return false, used, rem, reset, ceil_us(at - t), nil, nil, not same and wid, c + cost, pv
  end

  -- commit writes counts c and pv of window wid; refund reuses it.
  if MODE ~= '1' then
    function swc_commit(key, L, W, B, now, now_s, cost, Bs, wid, c, pv)
      if not wid then
        redis.call('HSET', key, 'c', us(c))
        return ''
      end
      redis.call('HSET', key, 'w', us(wid), 'c', us(c), 'p', us(pv))
      redis.call('PEXPIREAT', key, us(ceil((wid + 2) * W / 1000)))
      return ''
    end
  end

  if REFUNDS then
    function swc_refund(key, L, W, B, now, cost, charge_now, token, Bs)
      local wid, c, pv, t, found = load(key, W, now)
      if not found then
        return
      end
      local cw = floor(charge_now / W)
      if cw == wid then
        c = nonneg(c - cost)
      elseif cw == wid - 1 then
        pv = nonneg(pv - cost)
      else
        return
      end
      swc_commit(key, L, W, B, now, nil, cost, Bs, wid, c, pv)
    end
  end
end
