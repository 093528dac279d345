-- token_bucket (code 1): a bucket of B tokens refilled at L tokens per W µs.
--
-- Keys/arguments: one limit of check.lua (KEYS[i]; ARGV code '1', L, W, B, token unused).
-- State: hash {tk = tokens (float), ts = µs of the last update, cap = B it was written with}.
-- A missing key is a full bucket. When cap differs from B (an admin changed the limit) the
-- tokens shift by B - cap, clamped to [0, B], so consumption survives the change: 90 used of
-- 100 raised to 200 leaves 110.
-- Allowed when tokens >= cost. remaining = floor(tokens), used = B - remaining.
-- Denied: retry = ceil((cost - tokens) * W / L). reset = now + (B - tokens) * W / L.
-- TTL: until the bucket is full again, when a missing key means the same.
-- Refund: tokens = min(B, tokens + cost).
-- Commands: HMGET, and on commit HSET + PEXPIRE.
local tb_eval, tb_commit, tb_refund
if NEED_1 == '1' or NEED and NEED['1'] then
  -- load returns the tokens at t = max(now, ts), refilled and adjusted to B, and whether the
  -- stored cap is B already.
  local function load(key, L, W, B, Bs, now)
    local v = redis.call('HMGET', key, 'tk', 'ts', 'cap')
    local tk = tonumber(v[1])
    if not tk then
      return B, now, false
    end
    local ts = tonumber(v[2]) or now
    local cap = B
    local same = v[3] == Bs -- strings compare by identity
    if not same then cap = tonumber(v[3]) or B end
    if cap ~= B then
      tk = tk + (B - cap)
      if tk < 0 then tk = 0 end
      if tk > B then tk = B end
    end
    local t = now
    if ts > t then t = ts end
    tk = tk + (t - ts) * L / W
    if tk > B then tk = B end
    return tk, t, same
  end

  -- eval: s1 = t, s2 = tokens after consumption, s3 = whether the stored cap is B already.
  function tb_eval(key, L, W, B, now, cost, Bs)
    local tk, t, same = load(key, L, W, B, Bs, now)
    local rem = floor_nn(tk)
    local reset = t + (B - tk) * W / L
    if le(cost, tk) then
      local after = tk - cost
      if after < 0 then after = 0 end
      local arem = floor_nn(after)
      return true, B - rem, rem, reset, B - arem, arem, t + (B - after) * W / L, t, after, same
    end
    return false, B - rem, rem, reset, ceil_us((cost - tk) * W / L)
  end

  -- commit writes tk tokens at t (cap too unless same); refund reuses it.
  if MODE ~= '1' then
    function tb_commit(key, L, W, B, now, now_s, cost, Bs, t, tk, same)
      local ts = now_s
      if t ~= now then ts = us(t) end
      if same then
        redis.call('HSET', key, 'tk', num(tk), 'ts', ts)
      else
        redis.call('HSET', key, 'tk', num(tk), 'ts', ts, 'cap', Bs)
      end
      redis.call('PEXPIRE', key, ttl_ms(t - now + (B - tk) * W / L))
      return ''
    end
  end

  if MODE == '2' then
    function tb_refund(key, L, W, B, now, cost, charge_now, token, Bs)
      if redis.call('EXISTS', key) == 0 then
        return
      end
      local tk, t, same = load(key, L, W, B, Bs, now)
      tk = tk + cost
      if tk > B then tk = B end
      tb_commit(key, L, W, B, now, us(now), cost, Bs, t, tk, same)
    end
  end
end
