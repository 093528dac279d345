-- call: one call of the check script, as the function check(KEYS, ARGV) -> reply. Store runs
-- prelude.lua + need.lua + the algorithm files + this file + a driver as ONE script, so that
-- every limit of one subject is evaluated and charged atomically even when the limits use
-- different algorithms. The driver check.lua runs one call (the script's own KEYS and ARGV);
-- batch.lua runs many, each with its KEYS and ARGV cut out of the script's ARGV, all in one
-- script run (one EVALSHA) and at one instant.
--
-- KEYS and ARGV of one call:
-- KEYS[1..n]   the limit keys (all in one cluster slot)
-- KEYS[n+1]    the idempotency record key (same slot), present only when ARGV[4] ~= "0"
-- then, in the mixed and shared layouts (FIELDS) only, n more: the shared hash of each
--              limit's bucket (shared.lua), in the limits' order (same slot)
-- ARGV[1]      n, the number of limits (>= 1; 0 in mode "3")
-- ARGV[2]      cost (>= 1)
-- ARGV[3]      mode: "0" charge, "1" peek, "2" refund, "3" record, "4" charge without
--              writing the record, "5" settle a reservation (settle, below; not in a batch),
--              "6" count: charge every limit whether it allows or not (Envoy's reference
--              service counts hits over the limit too; no idempotency record)
-- ARGV[4]      idempotency TTL in ms; "0" = no idempotency record
-- ARGV[5]      charge and record: the request's fingerprint, bound to the record ("" for none;
--              ignored without a record); refund: now_us of the charge being refunded;
--              peek: ""
-- then 5 per limit i, at ARGV[5 + 5*(i-1) + 1 ..]:
--              algorithm code (the bucket.Algorithm value: 1 token_bucket, 2 leaky_bucket,
--              3 fixed_window, 4 sliding_window_log, 5 sliding_window_counter, 6 gcra,
--              7 calendar_window, 8 concurrency), limit, window_us, burst (capacity, already resolved,
--              >= 1), all decimal integers (a fixed window's limit may be 0: it denies
--              every charge) (calendar_window sends its periods in the places
--              of the window and the burst: lua/calendar_window.lua),
--              refund token (refund; a charge's of concurrency: the lease's id; a charge's
--              or peek's of a queue, gcra or leaky_bucket with a max delay: the longest
--              delay in µs, lua/gcra.lua; else ""), which eval gets after Bs; in mode "5"
--              two more per limit (7 in all): the overage bound and fit (settle, below)
--
-- Time comes only from redis.call('TIME'): now_us = sec * 1e6 + usec (+ SHIFT, 0 but in tests:
-- scripts.go), read once per script run (clock), so that every call of a batch decides at the
-- same instant.
--
-- An idempotency record is one per checked request, not one per call: it lives in the slot of
-- one of the request's calls (Store picks it) and says "this request was allowed and charged";
-- its value is the fingerprint alone. There is none for a denied request, whose retry is
-- decided afresh (nothing of it was charged).
-- Charge ("0" and "4"): when the record exists and holds ARGV[5] (a retry), nothing is charged:
-- the limits are evaluated as by a peek and the reply has replayed = 1 (Store then answers the
-- first decision, allowed). For another fingerprint (the key reused for another request) the
-- reply is the error 'IDEMPOTENCY_CONFLICT ...' and nothing changes either: replaying would
-- let one key pass any number of different requests uncharged.
-- Otherwise every limit is evaluated; only if ALL allow is every limit's new state written (a
-- denied check writes nothing). Then mode "0" (a call that decides the request on its own)
-- stores the record, SET PX ARGV[4], when allowed; mode "4" (one call of several) never does:
-- Store writes it with mode "3" once every call of the request allowed.
-- Record ("3", n = 0): SET KEYS[1] ARGV[5] PX ARGV[4]; the reply is empty.
-- Records of the previous script version (one per subject, under rl:{...}:idem:<key>) have
-- other names and are never read: a retry that spans the upgrade is charged again, which errs
-- towards denying, for at most their TTL (5 minutes), and they expire on their own.
-- Peek: evaluate only; the reply gives the state before consumption and whether cost fits.
-- Refund: give cost back to every limit exactly (see each algorithm), delete the idempotency
-- record when given (the charge it protected no longer exists, so a retry must be evaluated
-- afresh), then reply like a peek of the state after the refund.
--
-- Reply: { allowed (0/1), now_us (string), replayed (0/1), then 6 per limit:
--          allowed (0/1), used (integer, rounded up), remaining (integer, rounded down, >= 0),
--          reset_at_us (integer), retry_after_us (integer; "0" when allowed, >= 1 when denied),
--          refund_token (string, "" unless a charge needs one) }
-- Redis turns a Lua number of the reply into an integer by truncation, exact for the whole
-- numbers below 2^53 that these are, and without the %d format (2.3k instructions) a string
-- costs; now_us, formatted once per run, is a string, as tostring would keep only 14 digits.
-- A cost above a limit's capacity can never fit; its retry_after is then at least one window.

-- MODULES (defined before this file, by the dispatch that scripts.go derives from the algorithm
-- table: one line per algorithm, `if <code>_eval then MODULES['<n>'] = {<code>_eval,
-- <code>_commit, <code>_refund, <code>_charge} end`) maps an algorithm code to the eval, commit
-- and refund functions of its module (and its charge, the quick path of a batch's one-limit
-- charge, where it has one: batch.lua), for the modules this run built (need.lua): a table
-- each, built at chunk level, since a dispatch function would capture all the modules'
-- functions as upvalues, and each capture costs a walk of the chunk's open upvalues on every
-- run.

-- modules returns the eval, commit and refund functions of algorithm code c (nil for a code
-- without a module, or one this run did not build).
local function modules(c)
  local m = MODULES[c]
  if m then
    return m[1], m[2], m[3]
  end
end

-- NOW and NOW_S are the instant of this script run (µs, and as a string), read from Redis's
-- clock by the first call that needs it.
local NOW, NOW_S

local function clock()
  if not NOW then
    local tm = redis.call('TIME')
    NOW = tonumber(tm[1]) * 1000000 + tonumber(tm[2]) + SHIFT
    NOW_S = us(NOW)
  end
  return NOW, NOW_S
end

-- replay looks the idempotency record idem up before a charge bound to fingerprint fp:
-- returns the error reply to return, or nil and replayed: 1 when the record holds fp (a retry,
-- which turns the charge into a peek), 0 when there is none.
local function replay(idem, fp)
  local got = redis.call('GET', idem)
  if not got then
    return nil, 0
  end
  if got ~= fp then
    return redis.error_reply('IDEMPOTENCY_CONFLICT fingerprint mismatch')
  end
  return nil, 1
end

-- fields returns the six reply fields of one limit from the results of its eval, after
-- committing it when charged.
-- count (mode "6") commits a denied limit's as-if-charged state too.
local function fields(charged, count, commit, key, L, W, B, Bs, now, now_s, cost,
                      ok, used, rem, reset, a1, a2, a3, s1, s2, s3, tok)
  if charged and ok then
    local token = commit(key, L, W, B, now, now_s, cost, Bs, s1, s2, s3, tok)
    return 1, a1, a2, ceil_us(a3), '0', token
  end
  if ok then
    return 1, used, rem, ceil_us(reset), '0', ''
  end
  if count then
    commit(key, L, W, B, now, now_s, cost, Bs, s1, s2, s3, tok)
  end
  local retry = a1
  if cost > B and retry < W then retry = W end
  if retry < 1 then retry = 1 end
  return 0, used, rem, ceil_us(reset), retry, ''
end

-- one decides a call of one limit, the common case, apart from several: its state stays in
-- locals, which saves the tables of the general case. mode, cost and idem are validated.
local function one(KEYS, ARGV, mode, cost, idem)
  -- charge is whether this call may consume (a replay turns it off); replayed goes in the reply.
  local charge = mode == '0' or mode == '4' or mode == '6'
  local replayed = 0
  local ev, cm, rf = modules(ARGV[6])
  local L, W, B, Bs = int(ARGV[7]), int(ARGV[8]), int(ARGV[9]), ARGV[9]
  if not ev or not L or L < 0 or L == 0 and ARGV[6] ~= '3' or not W or W < 1 or not B or B < 1 then
    return redis.error_reply('ERR bucket: malformed limit 1')
  end

  local now, now_s = clock()
  if FIELDS then
    HASH = KEYS[#KEYS]
  end

  if charge and idem then
    local err
    err, replayed = replay(idem, ARGV[5])
    if err then return err end
    charge = replayed == 0
  elseif mode == '2' then
    local charge_now = tonumber(ARGV[5])
    if not charge_now then
      return redis.error_reply('ERR bucket: refund without charge time')
    end
    rf(KEYS[1], L, W, B, now, cost, charge_now, ARGV[10], Bs)
    if idem then
      redis.call('DEL', idem)
    end
  end

  local ok, used, rem, reset, a1, a2, a3, s1, s2, s3 = ev(KEYS[1], L, W, B, now, cost, Bs, ARGV[10])
  local f1, f2, f3, f4, f5, f6 = fields(charge, mode == '6', cm, KEYS[1], L, W, B, Bs, now, now_s, cost,
    ok, used, rem, reset, a1, a2, a3, s1, s2, s3, ARGV[10])
  if charge and ok and idem and mode == '0' then
    redis.call('SET', idem, ARGV[5], 'PX', ARGV[4])
  end
  return {f1, now_s, replayed, f1, f2, f3, f4, f5, f6}
end

-- many decides a call of n > 1 limits. mode, cost and idem are validated.
-- It is built only when a call of several limits may come (NEED is set: need.lua): a closure
-- costs its upvalues on every run, and most runs are one call of one limit.
local many
if NEED then
  many = function(KEYS, ARGV, n, mode, cost, idem)
    -- charge is whether this call may consume (a replay turns it off); replayed goes in the reply.
    local charge = mode == '0' or mode == '4' or mode == '6'
    local replayed = 0
    -- P holds S entries per limit i, from j = S*(i-1): the module's eval, commit and refund at
    -- j+1..j+3, L, W, B at j+4..j+6, and eval's ten results at j+7..j+16: one flat table, built
    -- at its full size, is cheaper than tables per limit.
    local S = 16
    local P = sized(n * S)
    for i = 1, n do
      local b = 5 + (i - 1) * 5
      local ev, cm, rf = modules(ARGV[b + 1])
      local L, W, B = int(ARGV[b + 2]), int(ARGV[b + 3]), int(ARGV[b + 4])
      if not ev or not L or L < 0 or L == 0 and ARGV[b + 1] ~= '3' or not W or W < 1 or not B or B < 1 then
        return redis.error_reply('ERR bucket: malformed limit ' .. i)
      end
      local j = (i - 1) * S
      P[j + 1], P[j + 2], P[j + 3], P[j + 4], P[j + 5], P[j + 6] = ev, cm, rf, L, W, B
    end

    local now, now_s = clock()
    -- the shared hash of limit i is KEYS[h + i]
    local h = #KEYS - n

    if charge and idem then
      local err
      err, replayed = replay(idem, ARGV[5])
      if err then return err end
      charge = replayed == 0
    elseif mode == '2' then
      local charge_now = tonumber(ARGV[5])
      if not charge_now then
        return redis.error_reply('ERR bucket: refund without charge time')
      end
      for i = 1, n do
        local j, b = (i - 1) * S, 5 + (i - 1) * 5
        if FIELDS then HASH = KEYS[h + i] end
        P[j + 3](KEYS[i], P[j + 4], P[j + 5], P[j + 6], now, cost, charge_now, ARGV[b + 5], ARGV[b + 4])
      end
      if idem then
        redis.call('DEL', idem)
      end
    end

    local all = true
    for i = 1, n do
      local j = (i - 1) * S
      if FIELDS then HASH = KEYS[h + i] end
      P[j + 7], P[j + 8], P[j + 9], P[j + 10], P[j + 11], P[j + 12], P[j + 13], P[j + 14], P[j + 15], P[j + 16] =
        P[j + 1](KEYS[i], P[j + 4], P[j + 5], P[j + 6], now, cost, ARGV[5 + (i - 1) * 5 + 4], ARGV[5 + (i - 1) * 5 + 5])
      if not P[j + 7] then all = false end
    end

    local charged = charge and (all or mode == '6')
    local reply = sized(3 + 6 * n)
    reply[1], reply[2], reply[3] = all and 1 or 0, now_s, replayed
    local k = 3
    for i = 1, n do
      local j = (i - 1) * S
      if FIELDS then HASH = KEYS[h + i] end
      reply[k + 1], reply[k + 2], reply[k + 3], reply[k + 4], reply[k + 5], reply[k + 6] =
        fields(charged, charged and mode == '6', P[j + 2], KEYS[i], P[j + 4], P[j + 5], P[j + 6], ARGV[5 + (i - 1) * 5 + 4], now, now_s, cost,
          P[j + 7], P[j + 8], P[j + 9], P[j + 10], P[j + 11], P[j + 12], P[j + 13], P[j + 14], P[j + 15], P[j + 16],
          ARGV[5 + (i - 1) * 5 + 5])
      k = k + 6
    end

    if charged and idem and mode == '0' then
      redis.call('SET', idem, ARGV[5], 'PX', ARGV[4])
    end
    return reply
  end
end

-- settle settles the part of a reservation in one slot (mode "5"; never in a batch): KEYS[n+1]
-- is the reservation's record (then, mixed and shared layouts, the limits' hashes), which must
-- still hold ARGV[5] ("open <charge now_us> ..." as Store.Mark wrote it), else the reply is the
-- error 'RESERVATION_UNKNOWN' (no record: never written, or expired) or 'RESERVATION_SETTLED
-- <record>' and nothing changes, so that a settle sent twice never charges twice. ARGV[2] is
-- the signed difference d = actual - estimate: d < 0 refunds -d to every limit as a refund of
-- the reservation's charge would (refund tokens in the limits' places); d > 0 charges each
-- limit c = d, but at most its bound (its 6th argument, -1 for none) and, when its 7th
-- argument is '1' (a bucket many callers share), only as far as it fits now (its remaining):
-- past the limit (the work is done) only a caller's own bucket goes, and never a balance
-- (code 9), which burns what it has and its overage cap allows. A limit's reply allowed
-- = 0 where d did not fit whole (an overage). Then the record becomes "done <d>", kept ARGV[4]
-- ms for retries. The reply is a check's, with the state after the settle (peek fields) and
-- reply[1] = 0 on an overage; a balance's token is what the settle burned (d > 0) or gave back
-- (d < 0), as lua/balance.lua writes them. Each limit takes 7 arguments here: code, L, W, B, refund token,
-- bound, fit. Concurrency limits (code 8) have no part in a reservation: their place is held
-- apart. The last argument, after the limits', is the settle's journal argument
-- ("<jid>|<holder>", "" for none): what it burned or gave back of a balance is journaled under
-- the settle's decision id (lua/balance.lua).
local function settle(KEYS, ARGV)
  local n, d, ttl = int(ARGV[1]), int(ARGV[2]), tonumber(ARGV[4])
  if not n or n < 1 or #ARGV ~= 6 + 7 * n or #KEYS ~= n + 1 + (FIELDS and n or 0) or not d or not ttl or ttl < 1 then
    return redis.error_reply('ERR bucket: malformed settle arguments')
  end
  local rec = KEYS[n + 1]
  local got = redis.call('GET', rec)
  if not got then
    return redis.error_reply('RESERVATION_UNKNOWN')
  end
  if got ~= ARGV[5] then
    return redis.error_reply('RESERVATION_SETTLED ' .. got)
  end
  local charge_now = tonumber(string.match(got, '^open (%d+)'))
  if not charge_now then
    return redis.error_reply('ERR bucket: malformed reservation record')
  end
  local now, now_s = clock()
  local jarg = ARGV[6 + 7 * n]
  local reply = sized(3 + 6 * n)
  reply[1], reply[2], reply[3] = 1, now_s, 0
  for i = 1, n do
    local b = 5 + (i - 1) * 7
    local ev, cm, rf = modules(ARGV[b + 1])
    local L, W, B, Bs = int(ARGV[b + 2]), int(ARGV[b + 3]), int(ARGV[b + 4]), ARGV[b + 4]
    local bound = int(ARGV[b + 6])
    if not ev or ARGV[b + 1] == '8' or not L or L < 1 or not W or W < 1 or not B or B < 1 or not bound then
      return redis.error_reply('ERR bucket: malformed limit ' .. i)
    end
    local fit, tok = 1, ''
    if FIELDS then HASH = KEYS[n + 1 + i] end
    if d > 0 then
      local c = d
      if bound >= 0 and c > bound then
        c = bound
      end
      if ARGV[b + 7] == '1' then
        local _, _, rem = ev(KEYS[i], L, W, B, now, 1, Bs)
        if c > rem then
          c = math.max(rem, 0)
        end
      end
      local ok, most, s1, s2, s3, _ = false, nil, nil, nil, nil, nil
      if c > 0 then
        ok, _, _, _, _, most, _, s1, s2, s3 = ev(KEYS[i], L, W, B, now, c, Bs)
      end
      if c > 0 and not ok and ARGV[b + 1] == '9' then
        -- A balance takes no debt: it burns what it has (and a soft one its overage cap), and
        -- the rest is an overage not taken.
        c = most
        if c > 0 then
          ok, _, _, _, _, _, _, s1, s2, s3 = ev(KEYS[i], L, W, B, now, c, Bs)
        end
      end
      if not ok or c < d then
        fit, reply[1] = 0, 0
      end
      if c > 0 then
        tok = cm(KEYS[i], L, W, B, now, now_s, c, Bs, s1, s2, s3, '|' .. jarg)
      end
    elseif d < 0 then
      tok = rf(KEYS[i], L, W, B, now, -d, charge_now, ARGV[b + 5], Bs, jarg)
    end
    if ARGV[b + 1] ~= '9' or type(tok) ~= 'string' then
      tok = '' -- only a balance reports what a settle moved
    end
    local _, used, rem, reset = ev(KEYS[i], L, W, B, now, 1, Bs)
    local k = 3 + (i - 1) * 6
    reply[k + 1], reply[k + 2], reply[k + 3], reply[k + 4], reply[k + 5], reply[k + 6] =
      fit, used, rem, ceil_us(reset), '0', tok
  end
  redis.call('SET', rec, 'done ' .. ARGV[2], 'PX', ARGV[4])
  return reply
end

-- check runs one call; KEYS and ARGV are the call's own (above).
local function check(KEYS, ARGV)
  -- tonumber (strtod) costs a third of a short redis.call: skip it for the usual n = cost = 1.
  local mode = ARGV[3]
  if mode == '5' and not BATCH then
    return settle(KEYS, ARGV)
  end
  if mode == '3' then
    if #KEYS ~= 1 or #ARGV ~= 5 or ARGV[1] ~= '0' or not tonumber(ARGV[4]) or tonumber(ARGV[4]) < 1 then
      return redis.error_reply('ERR bucket: malformed record arguments')
    end
    redis.call('SET', KEYS[1], ARGV[5], 'PX', ARGV[4])
    return {}
  end
  local n = ARGV[1] == '1' and 1 or int(ARGV[1])
  local cost = ARGV[2] == '1' and 1 or int(ARGV[2])
  local idem_ttl = ARGV[4] == '0' and 0 or tonumber(ARGV[4])
  if not n or n < 1 or #ARGV ~= 5 + 5 * n or not cost or cost < 1 or not idem_ttl
      or (mode ~= '0' and mode ~= '1' and mode ~= '2' and mode ~= '4' and mode ~= '6')
      or (mode == '6' and idem_ttl > 0) then
    return redis.error_reply('ERR bucket: malformed arguments')
  end
  local idem
  if idem_ttl > 0 then
    idem = KEYS[n + 1]
  end
  if #KEYS ~= n + (idem and 1 or 0) + (FIELDS and n or 0) then
    return redis.error_reply('ERR bucket: wrong number of keys')
  end
  if n == 1 then
    return one(KEYS, ARGV, mode, cost, idem)
  end
  return many(KEYS, ARGV, n, mode, cost, idem)
end
