-- sliding_window_log (code 4): at most L units in any W µs, one sorted-set entry per charge.
--
-- Keys/arguments: one limit of call.lua (KEYS[i]; ARGV code '4', L, W, B ignored; token:
-- the refund token of the charge, refund only).
-- State: a zset of one entry per charge, scored t (µs of the charge), named
--   "<d><id>:<cost>:<cum>"
-- id    the entry's number, the newest entry's plus one: it only grows along the set's order
--       and never changes, so that a refund token names its entry by (t, id);
-- <d>   one character, '!' + the number of digits of id - 1 ('!' to '/' for 1 to 15 digits,
--       10^15 charges: decades at a million a second): entries of one score sort by id, and
--       before the digits of legacy members (below);
-- cost  the units charged;
-- cum   the units of every entry up to this one, modulo M = 2^52: consecutive entries differ
--       by the later one's cost, so the live units are cum(newest) - cum(oldest live) +
--       cost(oldest live), two entries whatever the cost, and the entry that holds the k-th
--       oldest live unit is found by a binary search on ranks. M exceeds any live count (at
--       most L <= 2^50): differences taken modulo M are exact, and cum never outgrows doubles.
-- A check's Redis time and memory thus do not depend on its cost.
-- Entries with score <= t - W have expired; eval only counts the live ones, commit trims
-- them. A newest entry ahead of the clock (the clock stepped back) moves "now" to it.
-- Allowed when count + cost <= L. used = count, remaining = L - count.
-- Denied: the (count + cost - L)-th oldest live unit must expire first: retry = the score of
-- its entry + W - now. reset = newest score + W (now when empty).
-- TTL: W after the newest entry.
-- Refund token: "<t>:<id>"; refund removes that entry and takes its cost off the cum of every
-- entry after it (renaming them; those are the charges made since, usually few), so that the
-- sums stay exact. A refund of less than the entry's cost (a settle's) renames it with the rest. An entry already gone expired: nothing to give back.
-- Commands: ZRANGE (+ ZRANGEBYSCORE when the window is not empty), and on commit
-- ZREMRANGEBYSCORE, ZADD, PEXPIRE; a denial adds a binary search (ZCARD, ZCOUNT, ZRANGE)
-- unless the oldest live entry already holds the unit.
--
-- Legacy members. The previous version of this file wrote one member "<t>-<j>" per unit. Such
-- members sort after every entry of their score (digits come after '!'..'/'), and an old
-- script only appends at or after the newest score, so they are always a suffix of the set.
-- Whenever the newest member is legacy, eval first converts that suffix: its live members
-- become at most CONVERT_GROUPS entries (each placed at the newest score of the members it
-- replaces, so that no unit expires earlier than it would have: never over-admitting), its
-- expired ones are dropped. A refund token of the old script then finds nothing to remove,
-- which errs towards denying. An old script reading new entries counts each as one unit: during
-- a rolling upgrade a check of cost > 1 made by a new checker counts 1 on the old ones.
local swl_eval, swl_commit, swl_refund, swl_charge
if NEED_1 == '4' or NEED and NEED['4'] then
  local M = 4503599627370496 -- 2^52
  local BATCH = 500          -- members per ZADD/ZREM, within unpack's stack
  local CONVERT_GROUPS = 64  -- entries a legacy suffix becomes, at most
  local CONVERT_EXACT = 256  -- a legacy suffix up to this many live members converts exactly
  local sub, byte, char, sfind = string.sub, string.byte, string.char, string.find

  -- parse returns id, cost and cum of an entry, or nil for a legacy member.
  local function parse(m)
    if byte(m, 1) >= 48 then
      return nil
    end
    local a = sfind(m, ':', 3, true)
    local b = sfind(m, ':', a + 1, true)
    return tonumber(sub(m, 2, a - 1)), tonumber(sub(m, a + 1, b - 1)), tonumber(sub(m, b + 1))
  end

  local function name(id, cost, cum)
    local ids = us(id)
    return char(32 + #ids) .. ids .. ':' .. us(cost) .. ':' .. us(cum)
  end

  -- zadd adds the (score, member) pairs of args, BATCH at a time.
  local function zadd(key, args)
    for i = 1, #args, 2 * BATCH do
      redis.call('ZADD', key, unpack(args, i, math.min(i + 2 * BATCH - 1, #args)))
    end
  end

  local function zrem(key, members)
    for i = 1, #members, BATCH do
      redis.call('ZREM', key, unpack(members, i, math.min(i + BATCH - 1, #members)))
    end
  end

  -- at returns the member and score of rank r.
  local function at(key, r)
    local e = redis.call('ZRANGE', key, us(r), us(r), 'WITHSCORES')
    return e[1], tonumber(e[2])
  end

  -- convert replaces the legacy suffix of key (its newest member is legacy) by entries; t is
  -- max(now, newest score).
  local function convert(key, t, W)
    local n = redis.call('ZCARD', key)
    -- s: the first legacy rank. Gallop back from the newest, then bisect: the suffix is
    -- usually the few members of one old check, or the whole set.
    local lo, hi, step = 0, n - 1, 1
    while true do
      local r = hi - step
      if r < lo then break end
      local m = at(key, r)
      if parse(m) then
        lo = r + 1
        break
      end
      hi, step = r, step * 2
    end
    while lo < hi do
      local mid = floor((lo + hi) / 2)
      if parse(at(key, mid)) then lo = mid + 1 else hi = mid end
    end
    local s = lo
    local id, cum = 0, 0
    if s > 0 then
      local pid, _, pcum = parse(at(key, s - 1))
      id, cum = pid, pcum
    end
    local first = redis.call('ZCOUNT', key, '-inf', us(t - W)) -- the first live rank
    if first < s then first = s end
    local m = n - first
    local args = {}
    local function group(score, units)
      id, cum = id + 1, (cum + units) % M
      args[#args + 1] = us(score)
      args[#args + 1] = name(id, units, cum)
    end
    if m > 0 and m <= CONVERT_EXACT then
      local e = redis.call('ZRANGE', key, us(first), '-1', 'WITHSCORES')
      local score, units = nil, 0
      for i = 2, #e, 2 do
        local sc = tonumber(e[i])
        if score and sc ~= score then
          group(score, units)
          units = 0
        end
        score, units = sc, units + 1
      end
      group(score, units)
    elseif m > 0 then
      local from = first
      for g = 1, CONVERT_GROUPS do
        local to = first + floor(m * g / CONVERT_GROUPS) - 1
        if to >= from then
          local _, score = at(key, to)
          group(score, to - from + 1)
          from = to + 1
        end
      end
    end
    redis.call('ZREMRANGEBYRANK', key, us(s), '-1')
    zadd(key, args)
  end

  -- unit returns the score of the entry that holds the k-th oldest live unit: the first rank
  -- from the oldest live one whose cum - base reaches k (base = cum before the oldest live).
  local function unit(key, lo_s, base, k)
    local a = redis.call('ZCOUNT', key, '-inf', lo_s)
    local b = redis.call('ZCARD', key) - 1
    local step = 1
    while a < b do -- gallop: the unit is usually near the oldest
      local r = a + step - 1
      if r >= b then break end
      local _, _, c = parse(at(key, r))
      if (c - base) % M >= k then
        b = r
        break
      end
      a, step = r + 1, step * 2
    end
    while a < b do
      local mid = floor((a + b) / 2)
      local _, _, c = parse(at(key, mid))
      if (c - base) % M >= k then b = mid else a = mid + 1 end
    end
    local _, score = at(key, a)
    return score
  end

  -- eval: s1 = t (max of now and the newest entry), s2 and s3 = id and cum of the newest.
  function swl_eval(key, L, W, B, now, cost)
    local v = redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')
    local last = tonumber(v[2])
    local t = now
    if last and last > t then t = last end
    local id, cum = 0, 0
    if v[1] then
      local _
      id, _, cum = parse(v[1])
      if not id then
        convert(key, t, W)
        v = redis.call('ZRANGE', key, '-1', '-1', 'WITHSCORES')
        last = tonumber(v[2])
        id, cum = 0, 0
        if v[1] then id, _, cum = parse(v[1]) end
      end
    end
    local lo_s = us(t - W)
    local count, ocost, ocum, oscore = 0, 0, 0, 0
    if last and last > t - W then
      local o = redis.call('ZRANGEBYSCORE', key, '(' .. lo_s, '+inf', 'WITHSCORES', 'LIMIT', '0', '1')
      local _
      _, ocost, ocum = parse(o[1])
      oscore = tonumber(o[2])
      count = (cum - ocum + ocost) % M
    end
    local reset = t
    if count > 0 then reset = last + W end
    if count + cost <= L then
      return true, count, nonneg(L - count), reset, count + cost, nonneg(L - count - cost), t + W, t, id, cum
    end
    local k = count + cost - L
    if k > count then
      return false, count, nonneg(L - count), reset, reset - t, nil, nil, t, id, cum
    end
    if k <= ocost then
      return false, count, nonneg(L - count), reset, oscore + W - t, nil, nil, t, id, cum
    end
    return false, count, nonneg(L - count), reset, unit(key, lo_s, ocum - ocost, k) + W - t, nil, nil, t, id, cum
  end

  if MODE ~= '1' then
    function swl_commit(key, L, W, B, now, now_s, cost, Bs, t, id, cum)
      redis.call('ZREMRANGEBYSCORE', key, '-inf', us(t - W))
      local ts = us(t)
      redis.call('ZADD', key, ts, name(id + 1, cost, (cum + cost) % M))
      redis.call('PEXPIRE', key, ttl_ms(t + W - now))
      return ts .. ':' .. us(id + 1)
    end
  end

  if REFUNDS then
    function swl_refund(key, L, W, B, now, cost, charge_now, token, Bs)
      local colon = sfind(token, ':', 1, true)
      if not colon then
        return
      end
      local ts, id = sub(token, 1, colon - 1), tonumber(sub(token, colon + 1))
      if not id then
        return
      end
      -- The entries of score t sort by id (legacy members, if any, after them).
      local a = redis.call('ZCOUNT', key, '-inf', '(' .. ts)
      local b = a + redis.call('ZCOUNT', key, ts, ts) - 1
      while a < b do
        local mid = floor((a + b) / 2)
        local i = parse(at(key, mid))
        if i and i < id then a = mid + 1 else b = mid end
      end
      if a > b then
        return
      end
      local m = at(key, a)
      local i, c, ecum0 = parse(m)
      if i ~= id then
        return -- expired and trimmed: nothing counts it any more
      end
      redis.call('ZREM', key, m)
      -- A refund of part of the entry (a settle below its reservation's estimate) keeps the
      -- rest under the same id and score, so at the same rank.
      local r = c
      if cost < c then
        r = cost
        redis.call('ZADD', key, ts, name(i, c - r, (ecum0 - r) % M))
        a = a + 1
      end
      c = r
      local after = redis.call('ZRANGE', key, us(a), '-1', 'WITHSCORES')
      local old, args = {}, {}
      for j = 1, #after, 2 do
        local ei, ec, ecum = parse(after[j])
        if ei then
          old[#old + 1] = after[j]
          args[#args + 1] = after[j + 1]
          args[#args + 1] = name(ei, ec, (ecum - c) % M)
        end
      end
      zrem(key, old)
      zadd(key, args)
    end
  end
end
