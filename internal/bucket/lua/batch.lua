-- batch: the driver of many calls in one script run, so that a pipeline of checks costs Redis
-- one EVALSHA instead of one per check. Each call is decided by call.lua's check, exactly as
-- check.lua decides it alone, and all of them at one instant (clock). A call that fails (a
-- malformed call, a key of another type, a key this cluster node does not serve) fails alone:
-- the calls before it keep their effects, those after it still run.
--
-- KEYS         none: a call's keys travel in ARGV, so that calls of many slots share one run.
--              On a cluster, the script's first line, flags=allow-cross-slot-keys, lets it
--              touch keys of several slots, all of which must be served by this node: a key
--              that is not (its slot moved or is moving) fails its call with Redis's error
--              before anything of that call ran, since a call reads all its keys before it
--              writes any, and Store re-sends that call alone, with its keys declared.
-- ARGV[1]      m, the number of calls (>= 1)
-- then per call, in order: its head, its KEYS, its extras. The head is the call's ARGV
--              (call.lua) without its strings, as one string of space-separated fields:
--              n cost mode idem_ttl x, then code L W B per limit. x is the number of extras:
--              0 when the call's fingerprint or charge time (ARGV[5]) and its refund tokens are
--              all empty, else n + 1, those n + 1 values in ARGV's order. It has
--              n + (idem_ttl ~= "0" and 1 or 0) KEYS, n more in the mixed and shared
--              layouts (call.lua). Heads repeat from call to call (one per rule and mode), so
--              that a call costs Redis two or three arguments instead of 8 + 5 per limit, and
--              its parse is paid once per batch (need.lua; once for all batches in the
--              library).
--
-- Reply: the batch's instant (now_us, as in call.lua's reply; "" when no call read the clock),
-- then per call, in order, one of:
--   c >= 0 and the c entries of the reply the call would have got alone;
--   -1 and the error message the call would have got alone;
--   -(n + 1) for a quick call of n limits (quick, quickMany): n = 1, the limit's six fields;
--   n > 1, allowed and the six fields per limit. The call's reply is then allowed, now_us,
--   replayed = 0 and the fields: what it leaves out costs Redis a reply entry each (a string
--   of 16 digits for now_us), per check, and Store restores it (group.distribute).
--
-- The same file ends two ways (scripts.go): the batch script runs the batch at once; the batch
-- function library (LIBRARY, loaded once with FUNCTION LOAD) sets CALL, which its function runs
-- on each FCALL's ARGV (it has no KEYS) for the same reply. The library's modules, closures
-- and parsed heads are built once, not per run: a run then costs Redis its calls' work and
-- little more (docs/performance.md).
local unpack = unpack

-- quick is the common call, a charge of one limit with no idempotency record and no extras
-- (a head "1 <cost> 0 0 0 <code> <L> <W> <B>"), decided as call.lua's one decides it, by the
-- same module functions, without what one pays to be general: the call's KEYS and ARGV tables,
-- the parse and validation of its arguments (done once per head, by quickSpec) and its reply
-- table (the fields go straight into the batch's reply). Its replies are one's: allowed, used,
-- remaining, reset, retry_after, refund token. quickMany is the same for a call of n > 1 limits.
-- A module with a charge (q.charge: fixed_window.lua's fw_charge) decides it in one go when it
-- can, else by eval and commit.
local function quick(key, q, now, now_s)
  local L, W, B, Bs, cost = q[3], q[4], q[5], q[6], q.cost
  local ok, used, rem, reset, a1, a2, a3, s1, s2, s3
  if q.charge then
    local charged
    charged, used, rem, reset, a1 = q.charge(key, L, W, now, cost, q.c8)
    if charged == 1 then
      return 1, used, rem, ceil_us(reset), '0', ''
    elseif charged == 0 then
      ok = false -- denied: a1 is the retry
    end
  end
  if ok == nil then
    ok, used, rem, reset, a1, a2, a3, s1, s2, s3 = q[1](key, L, W, B, now, cost, Bs, '')
  end
  -- fields (call.lua) inlined: calling it costs 1.6k instructions a check, 3 % of a GCRA's.
  -- TestGroupQuickCalls holds the two to the same answers.
  if ok then
    return 1, a1, a2, ceil_us(a3), '0', q[2](key, L, W, B, now, now_s, cost, Bs, s1, s2, s3, '')
  end
  local retry = a1
  if cost > B and retry < W then retry = W end
  if retry < 1 then retry = 1 end
  return 0, used, rem, ceil_us(reset), retry, ''
end

-- quickSpec returns the quick form of spec s, or false when its calls are not charges without an
-- idempotency record or extras, or their arguments are malformed: check then decides them, and
-- reports what is malformed. The quick form is {n = n, cost = cost} and, for each limit i at
-- j = 6 * (i - 1), its module's eval and commit, L, W, B and Bs at j + 1 .. j + 6; for one
-- limit whose module has a charge, that as charge and cost * 8 as c8 (fixed_window.lua).
local function quickSpec(s)
  local a, n = s.argv, s.n
  if n < 1 or s.x ~= 0 or s.nk ~= (FIELDS and 2 * n or n) or a[3] ~= '0' or a[4] ~= '0' then
    return false
  end
  local cost = int(a[2])
  if not cost or cost < 1 then
    return false
  end
  local q = {n = n, cost = cost}
  for i = 1, n do
    local b, j = 5 * i, 6 * (i - 1)
    local ev, cm = modules(a[b + 1])
    local L, W, B = int(a[b + 2]), int(a[b + 3]), int(a[b + 4])
    if not ev or not L or L < 0 or L == 0 and a[b + 1] ~= '3' or not W or W < 1 or not B or B < 1 then
      return false
    end
    q[j + 1], q[j + 2], q[j + 3], q[j + 4], q[j + 5], q[j + 6] = ev, cm, L, W, B, a[b + 4]
  end
  if n == 1 then
    q.charge = MODULES[a[6]][4]
    q.c8 = us(cost * 8)
  end
  return q
end

-- call decides the call whose spec is s and whose head is ARGV[p] by check, as check.lua would
-- decide it alone.
local function call(s, p)
  local keys, args = {unpack(ARGV, p + 1, p + s.nk)}, s.argv
  if s.x > 0 then -- a copy: the spec's is shared
    args = {unpack(args)}
    local e = p + s.nk
    args[5] = ARGV[e + 1]
    for i = 1, s.n do
      args[5 + 5 * i] = ARGV[e + 1 + i]
    end
  end
  return check(keys, args)
end

-- R holds the ten results of eval per limit of the quick call quickMany decides, reused from
-- call to call.
local R = {}

-- quickMany decides a quick call of q.n > 1 limits as call.lua's many decides it (every limit
-- evaluated before any is written, all charged or none), writes its reply into out after
-- position at and returns the position of its last entry. An error leaves what it wrote past
-- at to be overwritten.
local function quickMany(p, q, now, now_s, out, at)
  local n, cost = q.n, q.cost
  local all = true
  for i = 1, n do
    local j, r = 6 * (i - 1), 10 * (i - 1)
    if FIELDS then HASH = ARGV[p + n + i] end
    R[r + 1], R[r + 2], R[r + 3], R[r + 4], R[r + 5], R[r + 6], R[r + 7], R[r + 8], R[r + 9], R[r + 10] =
      q[j + 1](ARGV[p + i], q[j + 3], q[j + 4], q[j + 5], now, cost, q[j + 6], '')
    if not R[r + 1] then all = false end
  end
  out[at + 1], out[at + 2] = -(n + 1), all and 1 or 0
  at = at + 2
  for i = 1, n do
    local j, r = 6 * (i - 1), 10 * (i - 1)
    if FIELDS then HASH = ARGV[p + n + i] end
    out[at + 1], out[at + 2], out[at + 3], out[at + 4], out[at + 5], out[at + 6] =
      fields(all, false, q[j + 2], ARGV[p + i], q[j + 3], q[j + 4], q[j + 5], q[j + 6], now, now_s, cost,
        R[r + 1], R[r + 2], R[r + 3], R[r + 4], R[r + 5], R[r + 6], R[r + 7], R[r + 8], R[r + 9], R[r + 10], '')
    at = at + 6
  end
  return at
end

-- run decides the calls of CALLS and returns the batch's reply.
local function run()
  if not CALLS then
    return redis.error_reply('ERR bucket: malformed batch')
  end
  local m = #CALLS / 2
  -- out is built at the size of m quick one-limit replies (and trimmed at the end: Redis's
  -- reply stops at the first nil), since growing a table entry by entry costs more. Its first
  -- entry is the instant, set last.
  local out = sized(7 * m + 1)
  local k = 1
  for c = 1, m do
    local s, p = CALLS[2 * c - 1], CALLS[2 * c]
    local q = s.quick
    if q == nil then
      q = quickSpec(s)
      s.quick = q
    end
    local ok, r, f2, f3, f4, f5, f6
    if q and q.n == 1 then
      local now, now_s = clock()
      if FIELDS then HASH = ARGV[p + 2] end
      ok, r, f2, f3, f4, f5, f6 = pcall(quick, ARGV[p + 1], q, now, now_s)
      if ok then
        out[k + 1], out[k + 2], out[k + 3], out[k + 4], out[k + 5], out[k + 6], out[k + 7] = -2, r, f2, f3, f4, f5, f6
        k = k + 7
      end
    elseif q then
      local now, now_s = clock()
      ok, r = pcall(quickMany, p, q, now, now_s, out, k)
      if ok then
        k = r
      end
    else
      ok, r = pcall(call, s, p)
      if ok then
        if type(r) == 'table' and not r.err then
          out[k + 1] = #r
          for i = 1, #r do
            out[k + 1 + i] = r[i]
          end
          k = k + 1 + #r
        else
          ok = false
        end
      end
    end
    if not ok then
      -- A script's error_reply, or an error raised by redis.call (a table with err since Redis
      -- 7.0) or by Lua itself (a string).
      if type(r) == 'table' then
        r = r.err
      elseif type(r) == 'string' and not string.find(r, '^%u+ ') then
        r = 'ERR ' .. r -- a Lua error, not a Redis reply with its code
      end
      out[k + 1], out[k + 2] = -1, tostring(r)
      k = k + 2
    end
  end
  out[1] = NOW_S or ''
  out[k + 1] = nil
  return out
end

if not LIBRARY then
  return run()
end

-- The library's function (CALL, scripts.go): the same run, on the ARGV of each FCALL, at its own
-- instant (clock).
CALL = function(argv)
  ARGV, NOW, NOW_S = argv, nil, nil
  CALLS = parse()
  return run()
end
