-- prelude: helpers shared by the algorithm files and the drivers.
--
-- Store concatenates prelude.lua, need.lua, the algorithm files (one per entry of the
-- algorithms table of algorithm.go, in its order), call.lua and a driver (check.lua for one
-- call, batch.lua for many) into ONE script, so every local defined here is an upvalue of the
-- algorithm functions. Nothing may be global: Redis rejects scripts that create globals.
--
-- KEYS and ARGV: see call.lua (one call) and batch.lua (many); need.lua reads just enough of
-- them to know which modules to build; call.lua validates everything.
--
-- The whole script runs on every call (EVALSHA caches the compiled chunk, not its state), so
-- what it builds is paid per check: every closure, every table, every string. (The batch
-- function library, scripts.go, runs once, at FUNCTION LOAD; its function then pays only its
-- calls' work.) Each algorithm
-- file therefore builds its functions only when a limit of this call uses it
-- (NEED_1 == code or NEED and NEED[code], code = the bucket.Algorithm value as a string),
-- into chunk-level locals <alg>_eval, <alg>_commit and <alg>_refund that call.lua
-- dispatches on; a module is no table and its results are no table either:
--   eval(key, L, W, B, now, cost, Bs) -> ok, used, rem, reset, a1, a2, a3, s1, s2, s3
--     Reads only (sliding_window_log's may first convert a previous version's state, which
--     changes no count). L limit, W window (µs), B burst (capacity, >= 1), now (µs), cost, all
--     numbers; Bs = the burst exactly as ARGV gave it (= us(B)).
--     ok               whether cost fits now
--     used, rem, reset the state before consumption (used rounded up, remaining rounded
--                      down, reset = µs when the bucket is fully available again)
--     a1, a2, a3       when ok: used, rem and reset after consuming cost;
--                      when not: a1 = µs until cost would fit (the driver raises it to >= 1,
--                      and to >= W for a cost above the capacity)
--     s1, s2, s3       when ok: whatever commit needs to write the new state
--   commit(key, L, W, B, now, now_s, cost, Bs, s1, s2, s3, token) -> refund token (string),
--     after every limit allowed. now_s = us(now); token = the limit's token argument of the
--     charge ("" but for concurrency, whose lease id it is).
--   refund(key, L, W, B, now, cost, charge_now, token, Bs): gives cost back exactly; eval is
--     called afterwards for the reply.
-- Every module clamps its own notion of "now" to the time stored in its state, so a clock
-- that steps back never refills anything.
--
-- Cost notes (Redis 7.0 CPU, counted in instructions under callgrind): a short redis.call
-- costs 5-7k instructions, a string.format 2.3k, a tonumber of a 10-16 digit string 1.9k
-- (strtod), a table 1-2k (much more when it grows key by key), a closure 0.5-1k (more with
-- many upvalues). Hence: arguments of redis.call are strings (Redis formats a Lua number
-- with %.17g, dearer than the call itself); integers are formatted with %d, half the cost of
-- %.0f; results travel as multiple return values, not tables; strings compare by identity
-- before being parsed; hot helpers are inlined rather than calling one another.

local floor, ceil, format = math.floor, math.ceil, string.format

-- int is tonumber, memoized in a batch for the argument strings it repeats in every call
-- (counts, limits, windows, bursts): Lua interns strings, so a hit costs a table probe where
-- strtod costs ~1.9k instructions. Only arguments go through it, a bounded set per run; state
-- read from keys differs per key and is parsed by tonumber itself. A single call repeats
-- nothing, so it keeps tonumber. A library's (need.lua) outlives its calls, and starts over
-- beyond 4096 strings so that it stays bounded.
local int = tonumber
if BATCH then
  local nums, n = {}, 0
  int = function(s)
    local v = nums[s]
    if v == nil then
      v = tonumber(s)
      if v then
        if n >= 4096 then
          nums, n = {}, 0
        end
        nums[s], n = v, n + 1
      end
    end
    return v
  end
end

-- sized returns a table whose array part holds m entries (zeros): filling a table built at
-- its full size is much cheaper than growing one (a multiple assignment even stores right to
-- left, so its first stores land in the hash part). Lua 5.1 has no table.new; a constructor
-- of string.byte's results sizes the table exactly.
local function sized(m)
  if m > 4000 then -- beyond the C stack string.byte may use
    return {}
  end
  return {string.byte(string.rep('\0', m), 1, m)}
end

-- Float comparisons get a relative/absolute slack of 1e-9 * max(|x|, 1) so that costs that
-- fit exactly (3 x 1/3 of a window) are not denied by rounding. The slack is inlined in each
-- helper (a Lua call costs more than the arithmetic), as a literal (a local would be one
-- more upvalue to capture per call).

-- le reports a <= b within the tolerance.
local function le(a, b)
  local m = b
  if m < 0 then m = -m end
  if m < 1 then m = 1 end
  return a <= b + m * 1e-9
end

-- floor_nn and ceil_nn round counts to integers >= 0, ignoring float noise just below/above
-- one: max(0, floor(x + slack)) and max(0, ceil(x - slack)).
local function floor_nn(x)
  local m = x
  if m < 0 then m = -m end
  if m < 1 then m = 1 end
  x = floor(x + m * 1e-9)
  if x < 0 then return 0 end
  return x
end

local function ceil_nn(x)
  local m = x
  if m < 0 then m = -m end
  if m < 1 then m = 1 end
  x = ceil(x - m * 1e-9)
  if x < 0 then return 0 end
  return x
end

-- ceil_us rounds a duration or time in µs up. The slack is absolute (1 ns): a relative one
-- would shave whole milliseconds off durations of days.
local function ceil_us(x)
  return ceil(x - 1e-3)
end

-- us formats an integral value (µs, ms, counts) exactly; tostring would use %.14g and lose
-- digits. Every value passed is integral and below 2^53, where %d is exact.
local function us(x)
  return format('%d', x)
end

-- num keeps a fractional state value exactly across a write/read round trip; integral
-- values print the same as with %.17g, only faster.
local function num(x)
  if x == floor(x) and x < 9007199254740992 and x > -9007199254740992 then
    return format('%d', x)
  end
  return format('%.17g', x)
end

-- ttl_ms converts a µs duration to a PEXPIRE argument: rounded up, at least 1 ms, as a
-- string.
local function ttl_ms(d)
  local ms = ceil(d / 1000)
  if ms < 1 then ms = 1 end
  return format('%d', ms)
end

local function nonneg(x)
  if x < 0 then return 0 end
  return x
end

