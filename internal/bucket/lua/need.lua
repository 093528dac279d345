-- need: which algorithm modules this run builds, read from the arguments before anything is
-- validated. call.lua and batch.lua validate; a malformed argument here only builds a module
-- too many or too few, and a limit whose module is missing is reported as malformed.
--
-- BATCH is set by the first lines of the script (scripts.go): false for check.lua's one
-- call, true for batch.lua's many.
--
-- NEED_1 is the algorithm code of the first limit of a single call; NEED holds the codes of the
-- others (nil for a single call of one limit, the common case, which then builds no table).
-- MODE: commit functions are built for every mode but peeks ('1'), refund functions for
-- refunds ('2') only. A record call ('3') has no limits, so builds nothing.
-- A batch builds the modules of all its calls into NEED; its MODE is '2' when one of its calls
-- refunds, else '0'.
local NEED_1, NEED, MODE
if not BATCH then
  NEED_1, MODE = ARGV[6], ARGV[3]
  if ARGV[1] ~= '1' then
    local n = tonumber(ARGV[1]) or 0
    if n > 1 and n * 5 + 5 == #ARGV then -- else malformed: call.lua reports it
      NEED = {}
      for i = 2, n do
        NEED[ARGV[5 + (i - 1) * 5 + 1]] = true
      end
    end
  end
else
  NEED, MODE = {}, '0'
  local p = 2 -- the first call's nk (batch.lua)
  for _ = 1, int(ARGV[1]) or 0 do
    local nk, na = int(ARGV[p]), int(ARGV[p + 1])
    if not nk or not na then
      break -- malformed: batch.lua reports it
    end
    local a = p + 2 + nk -- where the call's own ARGV starts
    if ARGV[a + 2] == '2' then
      MODE = '2'
    end
    local n = int(ARGV[a]) or 0
    if n * 5 + 5 ~= na then
      n = 0
    end
    for i = 1, n do
      local c = ARGV[a + 5 + (i - 1) * 5]
      if c then
        NEED[c] = true
      end
    end
    p = a + na
  end
end
