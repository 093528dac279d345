-- grant: writes and reads the grants of one balance (lua/balance.lua, whose helpers it uses),
-- as the admin API asks. Store runs a head that builds the balance module, lua/prelude.lua,
-- lua/balance.lua and this file as one script (grant.go: grantSource).
--
-- KEYS[1]   the balance's hash
-- KEYS[2]   its grants' metadata (a hash of its own in the same slot, so that a charge, which
--           reads the balance whole, never reads it)
-- ARGV[1]   the operation; ARGV[2] what to add to Redis's time, in µs (0 but in tests:
--           StoreConfig.ClockOffset); then the operation's:
--   put   ARGV[3..13]: id, amount, priority, effective (Unix ms; 0: now), expires (Unix ms;
--         0: never), recurring (0 or 1), rollover min, rollover max, W, B (the entitlement's
--         periods, as a charge sends them), and what the caller keeps with the grant (its
--         reason and maker, opaque here) under <id> in KEYS[2]. Makes g:<id>, issued for the period holding
--         Redis's time. The same grant put again (a retry) changes nothing; another grant of
--         that id is the error 'GRANT_EXISTS'; a grant past MAX_GRANTS is 'TOO_MANY_GRANTS'.
--   void  ARGV[3..5]: id, W, B. Voids the grant from now on (a second void keeps the first instant);
--         'GRANT_UNKNOWN' when there is none.
--   read  ARGV[3], ARGV[4]: W, B. Nothing is written.
--   use   ARGV[3..9]: amount, W, B, the record's TTL (ms), L, the thresholds to tell (as a
--         charge's token, lua/balance.lua), the journal argument ("<jid>|<holder>", "" for
--         none: what it burned is journaled as a charge's is); KEYS[3] the usage's record (same
--         slot). Burns amount of usage measured elsewhere, once per record: the live grants in
--         burn order, then overage for the rest, past a hard balance or a soft one's cap too
--         (the usage happened: the ledger holds it whole, and checks deny until grants come).
--         u and o grow as a charge's do. The record, SET PX, holds "<taken> <excess>" (what
--         the grants gave; what went past what the entitlement lets past zero, L - 1, with L
--         as a charge's in ARGV[7]), then "|" and the thresholds it told, as a charge's
--         refund token has them. A record that exists is a retry: nothing is burned, nothing
--         told.
-- Reply (put, void, read): { period start (Unix s), u, o, now (Unix ms), then 14 per grant:
--   id, its 11 fields (balance.lua), live (1 when it counts now), what was kept with it ("" for
--   none: a rollover's) }, the balance brought to the period holding Redis's time, as the next
--   charge would see it. use's reply is { 1 when replayed else 0, taken, excess, told, burned, moves } then that: burned
--   and moves as a charge's refund token has them (lua/balance.lua), "" for a replay.
local MAX_GRANTS = 256

-- clock_us is Redis's time in µs, shifted as asked.
local function clock_us()
  local tm = redis.call('TIME')
  return tonumber(tm[1]) * 1000000 + tonumber(tm[2]) + (tonumber(ARGV[2]) or 0)
end

local function reply(key, W, B)
  local now = clock_us()
  local st, _, live = bl_state(key, W, B, now)
  local is_live = {}
  for _, g in ipairs(live) do
    is_live[g.id] = true
  end
  local out = {us(st.p), us(st.u), us(st.o), us(floor(now / 1000))}
  for _, g in ipairs(st.grants) do
    out[#out + 1] = g.id
    for i = 1, 11 do
      out[#out + 1] = us(g[i])
    end
    out[#out + 1] = is_live[g.id] and '1' or '0'
    out[#out + 1] = redis.call('HGET', KEYS[2], g.id) or ''
  end
  return out
end

local key, op = KEYS[1], ARGV[1]
if op == 'read' then
  local W, B = tonumber(ARGV[3]), tonumber(ARGV[4])
  if #ARGV ~= 4 or not W or not B then
    return redis.error_reply('ERR grant: malformed read')
  end
  return reply(key, W, B)
end

if op == 'use' then
  local amount, W, B, ttl, L = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
  if #ARGV ~= 9 or #KEYS ~= 3 or not amount or amount < 1 or not W or not B or not ttl or ttl < 1 or not L or L < 1 then
    return redis.error_reply('ERR grant: malformed use')
  end
  local rec = redis.call('GET', KEYS[3])
  local head
  if rec then
    local taken, excess = string.match(rec, '^(%d+) (%d+)')
    head = {'1', taken or '0', excess or '0', '', '', ''}
  else
    local now = clock_us()
    local st, ends, live = bl_state(key, W, B, now)
    local o0 = st.o
    local left, burned, told = bl_apply(key, st, live, amount, now, ARGV[8])
    local excess = nonneg(left + o0 - (L - 1)) - nonneg(o0 - (L - 1))
    local spent = us(left) .. ',' .. table.concat(burned, ',')
    bl_journal(key, ARGV[9], 'c', now, st.p, ends, spent, told, st.moves)
    head = {'0', us(amount - left), us(excess), table.concat(told, ','), spent, table.concat(st.moves or {}, ',')}
    redis.call('SET', KEYS[3], head[2] .. ' ' .. head[3], 'PX', ttl)
  end
  local out = reply(key, W, B)
  for i = #head, 1, -1 do
    table.insert(out, 1, head[i])
  end
  return out
end

if op == 'void' then
  if #ARGV ~= 5 or not tonumber(ARGV[4]) or not tonumber(ARGV[5]) then
    return redis.error_reply('ERR grant: malformed void')
  end
  local v = redis.call('HGET', key, 'g:' .. ARGV[3])
  if not v then
    return redis.error_reply('GRANT_UNKNOWN')
  end
  local g = bl_decode(v)
  if g[10] == 0 then
    g[10] = floor(clock_us() / 1000)
    redis.call('HSET', key, 'g:' .. ARGV[3], bl_encode(g))
  end
  return reply(key, tonumber(ARGV[4]), tonumber(ARGV[5]))
end

if op ~= 'put' or #ARGV ~= 13 or #ARGV[13] > 4096 then
  return redis.error_reply('ERR grant: malformed arguments')
end
local id = ARGV[3]
local n = {}
for i = 4, 12 do
  n[i - 1] = tonumber(ARGV[i])
  if not n[i - 1] or n[i - 1] < 0 or n[i - 1] ~= floor(n[i - 1]) then
    return redis.error_reply('ERR grant: malformed argument ' .. i)
  end
end
local now = clock_us()
local now_ms = floor(now / 1000)
local wid = bl_period(n[10], n[11], now)
local eff = n[5]
if eff == 0 then eff = now_ms end
-- rem amt prio eff exp created rec rmin rmax void ip
local g = {n[3], n[3], n[4], eff, n[6], now_ms, n[7], n[8], n[9], 0, wid}
local field = 'g:' .. id
local old = redis.call('HGET', key, field)
if old then
  local o = bl_decode(old)
  -- The same definition is a retry of this put: the grant as it stands is the answer.
  if o[2] ~= g[2] or o[3] ~= g[3] or (n[5] ~= 0 and o[4] ~= g[4]) or o[5] ~= g[5] or o[7] ~= g[7] or o[8] ~= g[8] or o[9] ~= g[9] then
    return redis.error_reply('GRANT_EXISTS')
  end
  return reply(key, n[10], n[11])
end
local count = 0
for _, f in ipairs(redis.call('HKEYS', key)) do
  if string.sub(f, 1, 2) == 'g:' then count = count + 1 end
end
if count >= MAX_GRANTS then
  return redis.error_reply('TOO_MANY_GRANTS')
end
redis.call('HSET', key, field, bl_encode(g))
if ARGV[13] ~= '' then
  redis.call('HSET', KEYS[2], id, ARGV[13])
end
return reply(key, n[10], n[11])
