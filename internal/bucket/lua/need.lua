-- need: which algorithm modules this run builds, read from the arguments before anything is
-- validated. call.lua and batch.lua validate; a malformed argument here only builds a module
-- too many or too few, and a limit whose module is missing is reported as malformed.
--
-- BATCH is set by the first lines of the script (scripts.go): false for check.lua's one
-- call, true for batch.lua's many. LIBRARY is set for the batch function library (scripts.go),
-- which Redis runs once, at FUNCTION LOAD, and whose function then runs per call: it builds
-- every module then, and parses each call's ARGV when it runs (parse).
--
-- NEED_1 is the algorithm code of the first limit of a single call; NEED holds the codes of the
-- others (nil for a single call of one limit, the common case, which then builds no table).
-- MODE: commit functions are built for every mode but peeks ('1'), refund functions for
-- refunds ('2') and settles ('5') only (REFUNDS). A record call ('3') has no limits, so builds nothing.
-- A batch builds the modules of all its calls into NEED; its MODE is '2' when one of its calls
-- refunds, else '0'. CALLS is where its calls are (batch.lua reads it): per call, its spec and
-- the position of its head in ARGV; nil for a malformed batch, which runs no call. parse sets it
-- from ARGV.
local NEED_1, NEED, MODE, CALLS, parse
-- REFUNDS is whether the refund functions are built: for refunds, and for settles ('5'), which
-- refund what a reservation over-estimated.
local REFUNDS
if not BATCH then
  NEED_1, MODE = ARGV[6], ARGV[3]
  if ARGV[1] ~= '1' then
    -- A settle's limits take 7 arguments each (their overage bound and fit), the others 5;
    -- a settle has its journal argument last.
    local n, per = tonumber(ARGV[1]) or 0, MODE == '5' and 7 or 5
    if n > 1 and n * per + 5 + (MODE == '5' and 1 or 0) == #ARGV then -- else malformed: call.lua reports it
      NEED = {}
      for i = 2, n do
        NEED[ARGV[5 + (i - 1) * per + 1]] = true
      end
    end
  end
else
  NEED, MODE = {}, '0'
  if LIBRARY then
    setmetatable(NEED, {__index = function() return true end})
  end
  -- spec parses a call's head (batch.lua) into the call's ARGV for call.lua (with '' for the
  -- fingerprint or charge time and the refund tokens, which travel as extras when set), its
  -- number of keys nk (call.lua's KEYS), of limits n and of extras x; nil when malformed. The
  -- parse is paid once per distinct head: the calls of one rule share theirs.
  local function spec(head)
    local f = {}
    for w in string.gmatch(head, '[^ ]+') do
      f[#f + 1] = w
    end
    local n, x = tonumber(f[1]), tonumber(f[5])
    if not n or n < 0 or #f ~= 5 + 4 * n or (x ~= 0 and x ~= n + 1) then
      return nil
    end
    local argv = sized(5 + 5 * n)
    argv[1], argv[2], argv[3], argv[4], argv[5] = f[1], f[2], f[3], f[4], ''
    for i = 1, n do
      local a, b = 5 + 5 * (i - 1), 5 + 4 * (i - 1)
      argv[a + 1], argv[a + 2], argv[a + 3], argv[a + 4], argv[a + 5] = f[b + 1], f[b + 2], f[b + 3], f[b + 4], ''
      NEED[f[b + 1]] = true
    end
    if f[3] == '2' then
      MODE = '2'
    end
    return {argv = argv, n = n, x = x, nk = n + (f[4] ~= '0' and 1 or 0) + (FIELDS and n or 0)}
  end

  -- specs holds the heads parsed (spec), nspecs their number: a script's are its run's; a
  -- library's outlive its calls, so that a head costs its parse once, and start over beyond
  -- 1024 (group.go's maxHeads) so that they stay bounded.
  local specs, nspecs = {}, 0

  -- parse returns the calls of ARGV (CALLS), or nil when ARGV is malformed.
  parse = function()
    local m = int(ARGV[1])
    if not m or m < 1 then
      return nil
    end
    if nspecs >= 1024 then
      specs, nspecs = {}, 0
    end
    local calls = sized(2 * m)
    local p = 2 -- the first call's head
    for c = 1, m do
      local head = ARGV[p]
      local s = specs[head or '']
      if not s and head then
        s = spec(head)
        specs[head], nspecs = s, nspecs + 1
      end
      if not s then
        return nil
      end
      calls[2 * c - 1], calls[2 * c] = s, p
      p = p + 1 + s.nk + s.x
    end
    if p ~= #ARGV + 1 then
      return nil
    end
    return calls
  end
  if not LIBRARY then
    CALLS = parse()
  end
end
-- A library builds the refund functions too: its calls may refund.
REFUNDS = LIBRARY or MODE == '2' or MODE == '5'
