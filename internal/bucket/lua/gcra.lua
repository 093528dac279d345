-- gcra (code 6): the generic cell rate algorithm. T = W / L (emission interval), tau = B * T.
--
-- Keys/arguments: one limit of call.lua (KEYS[i]; ARGV code '6', L, W, B, token: "" or, for a
-- queue, D, the longest delay in µs).
-- State: string key holding the theoretical arrival time TAT in µs: "<integer µs>" when TAT is
-- a whole µs (when T is: W a multiple of L µs, as for 1000 per day), which Redis keeps as an
-- integer in the key's object (16 bytes instead of a 48-byte string); else
-- "<integer µs>.<9 fraction digits>": a double near 1.7e15 has only 0.25 µs of resolution, so
-- the fraction is kept apart and all arithmetic is done on diff = TAT - now, a small number.
-- Every version reads both forms (the previous one wrote only the second, with ".000000000"
-- for a whole µs), so the integer form needs no --bucket-layout switch. A missing key means
-- TAT = now.
-- tat = max(TAT, now), new_tat = tat + cost * T. Allowed when new_tat - now <= tau, or for a
-- queue (a leaky bucket used as one) when new_tat - now <= tau + D: the charge is then at the
-- slot now + (new_tat - now - tau), which the caller reads as its delay, reset - now - tau, so
-- that queued charges are spaced exactly T apart per unit of cost.
-- remaining = floor((tau - (tat - now)) / T), after consumption when allowed; used = B - remaining.
-- Denied: retry = new_tat - now - tau (- D for a queue). reset = new_tat (tat when denied).
-- TTL: until TAT, after which a missing key means the same.
-- Refund: TAT -= cost * T; the key is deleted when that is not after now.
-- Shared layout (SHARED; shared.lua): field key of a shared hash, "<e>|<TAT>", e the expiry
-- the key would have, rounded up to a second; a bucket with no field is read from its key and
-- moved into its field (the key deleted) by its next write. The mixed layout (FIELDS) writes
-- the key, but a bucket with no key and a field is read and written there.
-- Commands: GET, and on commit SET PX. Shared: fget (GET only for a bucket with no field),
-- and on commit fset (+ DEL of a key it was read from); a refund to nothing HDEL.
local gcra_eval, gcra_commit, gcra_refund, gcra_charge
if NEED_1 == '6' or NEED and NEED['6'] then
  -- load returns TAT - now, at least 0, and where its field is to be written (shared.lua),
  -- nil for its key: the field's expiry as read (0 for none), or -1 for a shared writer's
  -- bucket read from its key. A shared writer asks the field first, a mixed one the key
  -- first; either reads the other when the first holds nothing (shared.lua).
  local function load(key, now)
    local s, e
    if SHARED then
      s, e = fget(key, now)
    end
    if s == nil then
      s = redis.call('GET', key)
      if SHARED then
        e = s and -1 or 0
      elseif FIELDS and not s then
        s, e = fget(key, now)
        if s == nil then
          e = nil
        end
      end
    end
    if not s then
      return 0, e
    end
    local dot = string.find(s, '.', 1, true)
    local diff
    if dot then
      diff = (tonumber(string.sub(s, 1, dot - 1)) - now) + tonumber(string.sub(s, dot + 1)) / 1e9
    else
      diff = tonumber(s) - now
    end
    return nonneg(diff), e
  end

  -- eval: s1 = new TAT - now, s2 = what holds the state (load).
  function gcra_eval(key, L, W, B, now, cost, Bs, D)
    local T = W / L
    local tau = B * T
    local diff, e = load(key, now)
    local nd = diff + cost * T
    local rem = floor_nn((tau - diff) / T)
    if rem > B then rem = B end
    local q = tonumber(D) or 0
    if le(nd, tau + q) then
      local arem = floor_nn((tau - nd) / T)
      if arem > B then arem = B end
      return true, B - rem, rem, now + diff, B - arem, arem, now + nd, nd, e
    end
    return false, B - rem, rem, now + diff, ceil_us(nd - tau - q), nil, nil, nd, e
  end

  -- commit writes TAT = now + diff; refund reuses it.
  if MODE ~= '1' then
    function gcra_commit(key, L, W, B, now, now_s, cost, Bs, diff, held)
      local ip = floor(diff)
      local f9 = floor((diff - ip) * 1e9 + 0.5)
      if f9 >= 1e9 then
        ip = ip + 1
        f9 = 0
      end
      local v
      if f9 == 0 then
        v = format('%d', now + ip)
      else
        v = format('%d.%09d', now + ip, f9)
      end
      if held then
        if held == -1 then
          redis.call('DEL', key)
        end
        -- The expiry rounded up to a second: a later TAT mostly keeps it (shared.lua).
        fset(key, v, ceil((now + diff) / 1e6 + 1e-9) * 1000, held == -1 and 0 or held, now)
        return ''
      end
      redis.call('SET', key, v, 'PX', ttl_ms(diff))
      return ''
    end
  end

  if REFUNDS then
    function gcra_refund(key, L, W, B, now, cost, charge_now, token, Bs)
      local diff, e = load(key, now)
      diff = diff - cost * W / L
      if diff <= 1e-9 then
        if e and e > 0 then
          redis.call('HDEL', HASH, key)
        elseif e ~= 0 then
          redis.call('DEL', key)
        end
        return
      end
      gcra_commit(key, L, W, B, now, nil, cost, Bs, diff, e)
    end
  end
end
