-- prelude: helpers shared by the algorithm files and the driver (check.lua).
--
-- Store concatenates prelude.lua, the six algorithm files and check.lua into ONE script, so
-- every local defined here is an upvalue of the algorithm functions. Nothing may be global:
-- Redis rejects scripts that create globals.
--
-- Each algorithm file registers a loader, ALG[code] = function() ... return M end (code =
-- bucket.Algorithm value), and the driver calls it only for the algorithms a check uses:
-- building all six modules' closures on every call would cost more than running the check.
-- Contract of a module M:
--   eval(key, p, now, cost) -> r, reads only. p = {limit, window (µs), burst (capacity)}.
--     r.ok             whether cost fits now
--     r.used, r.rem, r.reset   the state before consumption (used rounded up, remaining
--                      rounded down, reset = µs when the bucket is fully available again)
--     r.aused, r.arem, r.areset  the same after consuming cost (only when r.ok)
--     r.retry          µs until cost would fit (only when not r.ok; the driver raises it
--                      to >= 1, and to >= W for a cost above the capacity)
--     plus whatever commit needs; eval never writes.
--   commit(key, p, now, cost, r) -> refund token (string) after every limit allowed.
--   refund(key, p, now, cost, charge_now, token): gives cost back exactly; eval is called
--     afterwards for the reply.
-- Every module clamps its own notion of "now" to the time stored in its state, so a clock
-- that steps back never refills anything.

local ALG = {}

-- Float comparisons get a relative/absolute slack of 1e-9 so that costs that fit exactly
-- (3 x 1/3 of a window) are not denied by rounding.
local EPS = 1e-9

local function tol(x)
  local a = math.abs(x)
  if a < 1 then a = 1 end
  return a * EPS
end

-- le reports a <= b within the tolerance.
local function le(a, b)
  return a <= b + tol(b)
end

-- floor_t and ceil_t round counts to integers, ignoring float noise just below/above one.
local function floor_t(x)
  return math.floor(x + tol(x))
end

local function ceil_t(x)
  return math.ceil(x - tol(x))
end

-- ceil_us rounds a duration or time in µs up. The slack is absolute (1 ns): a relative one
-- would shave whole milliseconds off durations of days.
local function ceil_us(x)
  return math.ceil(x - 1e-3)
end

-- us formats an integral µs value exactly; tostring would use %.14g and lose digits.
local function us(x)
  return string.format('%.0f', x)
end

-- num keeps a fractional state value exactly across a write/read round trip.
local function num(x)
  return string.format('%.17g', x)
end

-- ttl_ms converts a µs duration to a PEXPIRE argument: rounded up, at least 1 ms.
local function ttl_ms(d)
  local ms = math.ceil(d / 1000)
  if ms < 1 then ms = 1 end
  return ms
end

local function nonneg(x)
  if x < 0 then return 0 end
  return x
end
