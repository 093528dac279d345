-- sliding_window_log (code 4): at most L units in any W µs, one sorted-set member per unit.
--
-- Keys/arguments: one limit of check.lua (KEYS[i]; ARGV code '4', L, W, B ignored; token:
-- the refund token of the charge, refund only).
-- State: zset of members "<t>-<j>" scored t (µs of the charge); each unit of cost is one
-- member, j makes members unique even for two charges in the same µs. Entries with
-- score <= now - W have expired; eval only counts the live ones (it never writes), commit
-- trims them. A newest entry ahead of the clock (the clock stepped back) moves "now" to it.
-- Allowed when count + cost <= L. used = count, remaining = L - count.
-- Denied: the (count + cost - L)-th oldest live entry must expire first:
-- retry = its score + W - now. reset = newest score + W (now when empty).
-- TTL: W after the newest entry.
-- Refund token: "<t>:<a>-<b>[,<a>-<b>...]", the suffixes j this charge added; refund ZREMs
-- exactly those members.
-- Commands: ZRANGE (+ ZCOUNT when not empty), and on commit ZREMRANGEBYSCORE, ZADD, PEXPIRE.
local swl_eval, swl_commit, swl_refund
if NEED_1 == '4' or NEED and NEED['4'] then
  local BATCH = 500

  -- add ZADDs members "<t>-<j>" for the first cost free suffixes j and returns them as
  -- ranges "a-b,c-d". Only when the newest entry is at t can a name be taken already.
  local function add(key, t, cost, last)
    local ts = us(t)
    local taken = {}
    local existing = {}
    if last and last >= t then
      existing = redis.call('ZRANGEBYSCORE', key, ts, ts)
    end
    local prefix = ts .. '-'
    for _, m in ipairs(existing) do
      if string.sub(m, 1, #prefix) == prefix then
        local j = tonumber(string.sub(m, #prefix + 1))
        if j then taken[j] = true end
      end
    end
    local ranges = {}
    local args = {}
    local j = #existing
    local start
    for _ = 1, cost do
      j = j + 1
      while taken[j] do
        if start then
          ranges[#ranges + 1] = start .. '-' .. (j - 1)
          start = nil
        end
        j = j + 1
      end
      if not start then start = j end
      args[#args + 1] = ts
      args[#args + 1] = prefix .. j
      if #args >= 2 * BATCH then
        redis.call('ZADD', key, unpack(args))
        args = {}
      end
    end
    if #args > 0 then
      redis.call('ZADD', key, unpack(args))
    end
    ranges[#ranges + 1] = start .. '-' .. j
    return ts .. ':' .. table.concat(ranges, ',')
  end

  -- eval: s1 = t (max of now and the newest entry), s2 = the newest entry's score.
  function swl_eval(key, L, W, B, now, cost)
    local v = redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')
    local last = tonumber(v[2])
    local t = now
    if last and last > t then t = last end
    local lo = '(' .. us(t - W)
    local count = 0
    if last and last > t - W then
      count = redis.call('ZCOUNT', key, lo, '+inf')
    end
    local reset = t
    if count > 0 then reset = last + W end
    if count + cost <= L then
      return true, count, nonneg(L - count), reset, count + cost, nonneg(L - count - cost), t + W, t, last
    end
    local k = count + cost - L
    if k <= count then
      local e = redis.call('ZRANGEBYSCORE', key, lo, '+inf', 'WITHSCORES', 'LIMIT', us(k - 1), '1')
      return false, count, nonneg(L - count), reset, tonumber(e[2]) + W - t
    end
    return false, count, nonneg(L - count), reset, reset - t
  end

  if MODE ~= '1' then
    function swl_commit(key, L, W, B, now, now_s, cost, Bs, t, last)
      redis.call('ZREMRANGEBYSCORE', key, '-inf', us(t - W))
      local token = add(key, t, cost, last)
      redis.call('PEXPIRE', key, ttl_ms(t + W - now))
      return token
    end
  end

  if MODE == '2' then
    function swl_refund(key, L, W, B, now, cost, charge_now, token, Bs)
      local colon = string.find(token, ':', 1, true)
      if not colon then
        return
      end
      local prefix = string.sub(token, 1, colon - 1) .. '-'
      local members = {}
      for a, b in string.gmatch(string.sub(token, colon + 1), '(%d+)-(%d+)') do
        for j = tonumber(a), tonumber(b) do
          members[#members + 1] = prefix .. j
          if #members >= BATCH then
            redis.call('ZREM', key, unpack(members))
            members = {}
          end
        end
      end
      if #members > 0 then
        redis.call('ZREM', key, unpack(members))
      end
    end
  end
end
