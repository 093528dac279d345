-- balance (code 9): an entitlement's balance for one subject, made of grants (rules/grant.go)
-- that a charge burns in order: by priority, then earliest expiry, then oldest, then id. A
-- balance lives only in Redis: it has no Go twin, and no fail mode decides it locally.
--
-- Keys/arguments: one limit of call.lua (KEYS[i]; ARGV code '9', then
--   L  1 + the overage cap: what a charge may take past a zero balance per period, summed
--      (1 for a hard entitlement; 2^44 + 1 for a soft one without a cap);
--   W, B  the entitlement's two calendar periods around the caller's clock, as
--      calendar_window.lua takes them (W the first's start in Unix s, B the two lengths in s
--      as first * 2^25 + second);
--   token  a charge's: the thresholds to tell, "" for none (below); a refund's: the
--      breakdown its charge answered).
-- State: a hash.
--   p   the period (its start, Unix s) the balance was last brought to
--   u   units charged in that period (burned and overage); o the overage among them
--   g:<id>  a grant: "rem amt prio eff exp created rec rmin rmax void ip", integers: what is
--       left, its amount, priority, when it starts and expires (Unix ms; exp 0: never), when
--       it was made (Unix ms), 1 when it recurs, the rollover's min and max (0 0: none), when
--       it was voided (Unix ms; 0: not), and the period it was last issued for (Unix s).
--   x:p<n>, x:b<n>  the period (as p) in which the threshold "used n %" or "balance below n"
--       was told; x:e<ms>:<id>  present once "grant id expires within ms" was told (dropped
--       with the grant).
-- The hash never expires: a subject's grants outlive its periods. grant.lua writes grants.
--
-- A period's start brings the balance to it once, by whichever charge or read comes first
-- (roll): u and o start over; each recurring grant not voided or ended is issued again for the
-- period, and with a rollover carries what it had left (at least min, at most max; its whole
-- amount when it was not used at all in the period before, as when no charge came) into a
-- grant of its own, "g:<id>~<period>", that expires with the period; grants that expired
-- or were voided before the period began are dropped. A grant made during a period is issued
-- for it already (ip), and is not issued again by that period's roll.
-- Live grants: not voided, started (eff <= now), not expired (exp = 0 or exp > now), rem > 0.
-- Allowed when cost <= the live grants' sum, or the excess plus o fits L - 1. used = u,
-- remaining = the sum. reset = the period's end. Denied: retry = reset - now (a recurring
-- grant comes back then; a top-up may come sooner).
-- Commit: roll, then burn the live grants in order, the excess going to o; the refund token is
-- "<ov> <id>:<n> ..." (overage, then what each grant gave, in burn order).
-- Refund (of a charge in the stored period only): give cost back, the overage first, then the
-- grants in reverse burn order, as the token says; u and o fall by as much. It returns what it
-- gave back, "<ov>,<id>:<n>,...", which a settle reports.
-- Moves: a charge that brings the balance to a new period appends, after a second "|", what
-- that did to the grants: F<n>:<id> (n forfeited: an expired grant's remainder dropped, or a
-- recurring grant's before it is issued again; a voided grant's was reported by its void),
-- R<n>:<id> (issued again, n its amount), C<n>:<id~period> (n rolled over into a new grant).
-- A refund keeps the moves: the new period stands.
-- Journal: a charge whose token carries a journal argument after its thresholds
-- ("<spec>|<jid>|<holder>": the id of the decision that reports the charge, and the holder as
-- the checker names it) also writes what it did into the balance's journal, the hash
-- key .. '#j' (the same hash tag, so the same slot; a key the script derives, which Redis lets
-- a script without flags touch), field jid:
--   "<k>,<now µs>,<period start s>,<period end µs>|<burned>|<told>|<moves>|<holder>"
-- k 'c' for a charge or use (burned as a refund token's first part), 'g' for a settle's give
-- back (burned: what it gave). The checker deletes the field once the decision is durable;
-- a field left (the checker killed, or the answer lost, after Redis charged) is published
-- again by the journal's sweeper, under the same decision id, so that the ledger, which counts
-- a decision's moves once, misses no burn (internal/bucket/journal.go). A journaled charge's
-- refund token has a fourth part, the jid, so that a refund of the whole charge (mode 2)
-- rewrites the field to the period's moves alone (or deletes it): the journal always says
-- what the decision will.
-- Commands: HGETALL; on commit HSET (+ HDEL of grants dropped by a roll; + HSET of the
-- journal); on refund HMGET, HSET (+ HGET and HSET or HDEL of the journal).
local bl_eval, bl_commit, bl_refund, bl_charge
-- The helpers below are chunk-level too, for grant.lua, which reads and writes balances with
-- them.
local bl_period, bl_read, bl_roll, bl_live, bl_state, bl_encode, bl_decode, bl_tell, bl_untell
local bl_dropped, bl_token, bl_apply, bl_journal
if NEED_1 == '9' or NEED and NEED['9'] then
  -- bl_period returns the start (Unix s) and the end (µs) of the period of W and B holding t,
  -- the lengths of both periods (s), or raises calendar_window.lua's error: each module builds
  -- its own helpers, since a prelude closure is paid by every run.
  function bl_period(W, B, t)
    local first = floor(B / 33554432)
    local second = B - first * 33554432
    local s2 = W + first
    local e2 = s2 + second
    if t >= s2 * 1000000 and t < e2 * 1000000 then
      return s2, e2 * 1000000, first, second
    end
    if t >= W * 1000000 and t < s2 * 1000000 then
      return W, s2 * 1000000, first, second
    end
    error({err = 'ERR bucket: calendar periods do not hold Redis\'s time'})
  end

  -- bl_decode reads a grant's field value into a table of its 11 numbers; bl_encode (below)
  -- writes one.
  function bl_decode(v)
    local g, k = {}, 0
    for n in string.gmatch(v, '[^ ]+') do
      k = k + 1
      g[k] = tonumber(n)
    end
    return g
  end

  -- bl_read returns the hash as a state: p, u, o and the grants, each a table of its fields
  -- and its id, in a list.
  function bl_read(key)
    local h = redis.call('HGETALL', key)
    local st = {grants = {}}
    for i = 1, #h, 2 do
      local f, v = h[i], h[i + 1]
      if f == 'p' then
        st.p = tonumber(v)
      elseif f == 'u' then
        st.u = tonumber(v)
      elseif f == 'o' then
        st.o = tonumber(v)
      elseif string.sub(f, 1, 2) == 'g:' then
        local g = bl_decode(v)
        g.id = string.sub(f, 3)
        st.grants[#st.grants + 1] = g
      elseif string.sub(f, 1, 2) == 'x:' then
        st.marks = st.marks or {}
        st.marks[string.sub(f, 3)] = tonumber(v)
      end
    end
    st.u, st.o = st.u or 0, st.o or 0
    return st
  end

  -- bl_roll brings st to the period starting at wid (s) and ending at ends (µs), whose and
  -- whose neighbour's lengths are first and second (s); changed grants are marked dirty,
  -- dropped ones gone (their ids in st.drop), rollovers added.
  function bl_roll(st, wid, ends, first, second)
    if st.p and st.p >= wid then
      return
    end
    -- A grant last issued less than 1.5 periods before wid was issued for the period just
    -- before (periods vary: 23-25 h days, 28-31 day months), else for an older one.
    local longest = first
    if second > longest then longest = second end
    local start_ms = wid * 1000
    local kept, drop, added, moves = {}, st.drop or {}, {}, st.moves or {}
    for _, g in ipairs(st.grants) do
      if (g[10] > 0 and g[10] <= start_ms) or (g[5] > 0 and g[5] <= start_ms) then
        drop[#drop + 1] = g.id
        if g[10] == 0 and g[1] > 0 then
          moves[#moves + 1] = 'F' .. us(g[1]) .. ':' .. g.id -- expired unused (a void's is its own)
        end
      else
        if g[7] == 1 and g[11] < wid then
          if g[1] > 0 then
            moves[#moves + 1] = 'F' .. us(g[1]) .. ':' .. g.id
          end
          moves[#moves + 1] = 'R' .. us(g[2]) .. ':' .. g.id
          if g[9] > 0 then
            local left = g[1]
            if (wid - g[11]) * 2 >= longest * 3 then
              left = g[2] -- issued for an older period, so the one before went unused
            end
            if left < g[8] then left = g[8] end
            if left > g[9] then left = g[9] end
            if left > 0 then
              added[#added + 1] = {left, left, g[3], start_ms, ceil(ends / 1000), start_ms, 0, 0, 0, 0, wid,
                id = g.id .. '~' .. us(wid), dirty = true}
              moves[#moves + 1] = 'C' .. us(left) .. ':' .. g.id .. '~' .. us(wid)
            end
          end
          g[1], g[11], g.dirty = g[2], wid, true
        end
        kept[#kept + 1] = g
      end
    end
    for _, g in ipairs(added) do
      kept[#kept + 1] = g
    end
    st.grants, st.drop, st.moves, st.p, st.u, st.o, st.rolled = kept, drop, moves, wid, 0, 0, true
  end

  -- bl_live returns the live grants at now_ms in burn order, and their sum.
  function bl_live(st, now_ms)
    local live, sum = {}, 0
    for _, g in ipairs(st.grants) do
      if g[10] == 0 and g[4] <= now_ms and (g[5] == 0 or g[5] > now_ms) and g[1] > 0 then
        live[#live + 1] = g
        sum = sum + g[1]
      end
    end
    table.sort(live, function(a, b)
      if a[3] ~= b[3] then return a[3] < b[3] end
      if a[5] ~= b[5] then
        if a[5] == 0 then return false end
        if b[5] == 0 then return true end
        return a[5] < b[5]
      end
      if a[6] ~= b[6] then return a[6] < b[6] end
      return a.id < b.id
    end)
    return live, sum
  end

  -- bl_state reads key brought to the period holding now: the state, the period's end (µs),
  -- the live grants and their sum.
  function bl_state(key, W, B, now)
    local wid, ends, first, second = bl_period(W, B, now)
    local st = bl_read(key)
    if st.p and st.p > wid then
      -- A later period (a caller's clock ahead wrote it): its end is unknown, this one's
      -- stands in, and nothing is rolled back.
      wid = st.p
    end
    bl_roll(st, wid, ends, first, second)
    local live, sum = bl_live(st, floor(now / 1000))
    return st, ends, live, sum
  end

  function bl_eval(key, L, W, B, now, cost)
    local st, ends, live, sum = bl_state(key, W, B, now)
    local over = cost - sum
    if over <= 0 or over + st.o <= L - 1 then
      st.live, st.cost, st.ends = live, cost, ends
      return true, st.u, sum, ends, st.u + cost, nonneg(sum - cost), ends, st
    end
    -- The sixth value, which call.lua's check ignores, is the most a charge may take now: a
    -- settle past the balance burns that much and reports the rest as not taken.
    return false, st.u, sum, ends, ends - now, nonneg(sum + L - 1 - st.o)
  end

  -- bl_encode is a grant's field value.
  function bl_encode(g)
    return format('%d %d %d %d %d %d %d %d %d %d %d', g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11])
  end

  -- bl_tell returns the thresholds of spec (above) that st, charged, makes true and that were
  -- not told yet, as a list, marking them told in st (st.told: the x: fields to write).
  function bl_tell(st, now_ms, spec)
    local out = {}
    if not spec or spec == '' then
      return out
    end
    local live, sum = bl_live(st, now_ms)
    local marks = st.marks or {}
    st.marks, st.told = marks, st.told or {}
    local function tell(t, v)
      out[#out + 1] = t
      st.told[#st.told + 1] = t
      marks[t] = v
    end
    for t in string.gmatch(spec, '[^,]+') do
      local kind, n = string.sub(t, 1, 1), tonumber(string.sub(t, 2))
      if not n or (kind ~= 'p' and kind ~= 'b' and kind ~= 'e') then
        error({err = 'ERR bucket: malformed threshold ' .. t})
      end
      if kind == 'e' then
        for _, g in ipairs(live) do
          local name = t .. ':' .. g.id
          if g[5] > 0 and g[5] - now_ms <= n and not marks[name] then
            tell(name, 1)
          end
        end
      elseif marks[t] ~= st.p then
        local hit
        if kind == 'p' then
          hit = st.u > 0 and st.u * 100 >= n * (st.u + sum)
        else
          hit = sum < n
        end
        if hit then
          tell(t, st.p)
        end
      end
    end
    return out
  end

  -- bl_untell unmarks the thresholds told (a refund token's part after '|') in key.
  function bl_untell(key, told)
    local del = {}
    for t in string.gmatch(told, '[^,]+') do
      del[#del + 1] = 'x:' .. t
    end
    if #del > 0 then
      redis.call('HDEL', key, unpack(del))
    end
  end

  -- bl_dropped returns the fields to delete with st's dropped grants: theirs, and the marks
  -- of their expiry.
  function bl_dropped(st)
    local del = {}
    for _, id in ipairs(st.drop or {}) do
      del[#del + 1] = 'g:' .. id
      for name in pairs(st.marks or {}) do
        if string.sub(name, 1, 1) == 'e' and string.sub(name, -(#id + 1)) == ':' .. id then
          del[#del + 1] = 'x:' .. name
        end
      end
    end
    return del
  end

  -- bl_token is a charge's refund token: what it burned, then "|" and what it told, then "|"
  -- and what a new period's start did to the grants (moves), the last parts left out when
  -- empty; a journaled charge's has all three and a fourth, its journal id.
  function bl_token(burned, told, moves, jid)
    if jid and jid ~= '' then
      return burned .. '|' .. table.concat(told, ',') .. '|' .. table.concat(moves or {}, ',') .. '|' .. jid
    end
    if moves and #moves > 0 then
      return burned .. '|' .. table.concat(told, ',') .. '|' .. table.concat(moves, ',')
    end
    if #told > 0 then
      return burned .. '|' .. table.concat(told, ',')
    end
    return burned
  end

  -- bl_fields returns the HSET arguments of st's changed grants and counters.
  local function bl_fields(st)
    local args = {'p', us(st.p), 'u', us(st.u), 'o', us(st.o)}
    for _, t in ipairs(st.told or {}) do
      args[#args + 1] = 'x:' .. t
      args[#args + 1] = us(st.marks[t])
    end
    for _, g in ipairs(st.grants) do
      if g.dirty then
        args[#args + 1] = 'g:' .. g.id
        args[#args + 1] = bl_encode(g)
      end
    end
    return args
  end

  -- bl_apply burns amount from st's live grants in burn order, the rest counted as overage,
  -- tells spec's thresholds, and writes st to key: a charge's commit and a use (grant.lua)
  -- alike. It returns the overage, what each grant gave ("<id>:<n>" in burn order) and what
  -- it told.
  function bl_apply(key, st, live, amount, now, spec)
    local left, burned = amount, {}
    for _, g in ipairs(live) do
      if left == 0 then break end
      local take = g[1]
      if take > left then take = left end
      g[1], g.dirty, left = g[1] - take, true, left - take
      burned[#burned + 1] = g.id .. ':' .. us(take)
    end
    st.u, st.o = st.u + amount, st.o + left
    local told = bl_tell(st, floor(now / 1000), spec)
    redis.call('HSET', key, unpack(bl_fields(st)))
    local del = bl_dropped(st)
    if #del > 0 then
      redis.call('HDEL', key, unpack(del))
    end
    return left, burned, told
  end

  -- bl_journal writes what one decision did to the balance at key into its journal (above),
  -- when jarg ("<jid>|<holder>") names a decision; it returns the jid, nil for none.
  function bl_journal(key, jarg, k, now, pstart, pend, burned, told, moves)
    local jid, holder = string.match(jarg or '', '^([^|]*)|?(.*)$')
    if not jid or jid == '' then
      return nil
    end
    redis.call('HSET', key .. '#j', jid, k .. ',' .. us(now) .. ',' .. us(pstart) .. ',' .. us(pend) .. '|' ..
      burned .. '|' .. table.concat(told, ',') .. '|' .. table.concat(moves or {}, ',') .. '|' .. holder)
    return jid
  end

  if MODE ~= '1' then
    function bl_commit(key, L, W, B, now, now_s, cost, Bs, st, _, _, tok)
      if not st then
        -- A denied balance is never committed: call.lua's count mode ('6') is Envoy's
        -- descriptors', which no balance is.
        error({err = 'ERR bucket: a balance charged while denied'})
      end
      local spec, jarg = string.match(tok or '', '^([^|]*)|?(.*)$')
      local left, burned, told = bl_apply(key, st, st.live, cost, now, spec)
      local spent = us(left) .. ',' .. table.concat(burned, ',')
      local jid = bl_journal(key, jarg, 'c', now, st.p, st.ends, spent, told, st.moves)
      return bl_token(spent, told, st.moves, jid)
    end
  end

  if REFUNDS then
    -- bl_rejournal rewrites the journal field jid of key after its charge was refunded whole
    -- (mode 2): nothing burned or told stands, the period's moves do; no moves, no field.
    local function bl_rejournal(key, jid)
      local j = redis.call('HGET', key .. '#j', jid)
      if not j then
        return
      end
      local head, moves, holder = string.match(j, '^([^|]*)|[^|]*|[^|]*|([^|]*)|(.*)$')
      if not head or moves == '' then
        redis.call('HDEL', key .. '#j', jid)
      else
        redis.call('HSET', key .. '#j', jid, head .. '|||' .. moves .. '|' .. holder)
      end
    end

    -- jarg is a settle's journal argument (call.lua), nil for a refund of a check's charge.
    function bl_refund(key, L, W, B, now, cost, charge_now, token, _, jarg)
      local wid, pend = bl_period(W, B, charge_now)
      local h = redis.call('HMGET', key, 'p', 'u', 'o')
      if tonumber(h[1]) ~= wid or not token or token == '' then
        return -- the period was rolled since: its usage is history
      end
      local told, rest
      token, told, rest = string.match(token, '^([^|]*)|?([^|]*)|?(.*)$')
      if told ~= '' and MODE ~= '5' then
        -- A refunded charge's decision tells nothing; a settle's charge told, and stands.
        bl_untell(key, told)
      end
      local parts = {}
      for w in string.gmatch(token, '[^,]+') do
        parts[#parts + 1] = w
      end
      local left = cost
      local ov = tonumber(parts[1]) or 0
      if ov > left then ov = left end
      left = left - ov
      local given = {us(ov)}
      local args = {'u', us(nonneg((tonumber(h[2]) or 0) - cost)), 'o', us(nonneg((tonumber(h[3]) or 0) - ov))}
      for i = #parts, 2, -1 do
        if left == 0 then break end
        local id, n = string.match(parts[i], '^(.+):(%d+)$')
        local v = id and redis.call('HGET', key, 'g:' .. id)
        if v then
          local g = bl_decode(v)
          local give = tonumber(n)
          if give > left then give = left end
          g[1], left = g[1] + give, left - give
          args[#args + 1] = 'g:' .. id
          args[#args + 1] = bl_encode(g)
          given[#given + 1] = id .. ':' .. us(give)
        end
      end
      redis.call('HSET', key, unpack(args))
      -- What it gave back, as a charge's burned part: a settle reports it.
      local back = table.concat(given, ',')
      if MODE == '5' then
        bl_journal(key, jarg, 'g', now, wid, pend, back, {}, nil)
      else
        -- Within one period a refund finds every grant its charge burned (only a roll drops
        -- grants), so that the whole charge came back.
        local jid = string.match(rest, '|(.*)$')
        if jid and jid ~= '' then
          bl_rejournal(key, jid)
        end
      end
      return back
    end
  end
end
