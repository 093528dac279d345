-- concurrency (code 8): at most L requests in flight, each holding a lease until it is released
-- (Store.Release), or until its expiry when it never is: a crashed client cannot leak capacity.
--
-- Keys/arguments: one limit of call.lua (KEYS[i]; ARGV code '8', L, W = the lease's TTL (µs),
-- B ignored, token = the lease's id, which the caller draws at random: the charge that admits a
-- request adds it, the refund of that charge (another limit of the check denied) removes it).
-- A check holds one lease per concurrency limit whatever its cost.
-- State: a sorted set of lease ids scored by their expiry (µs); the key expires with its last
-- lease.
-- Allowed when the live leases (expiry > now) number at most L - 1. used = live leases,
-- remaining = L - used. reset = when the last live lease expires (at the latest: a release comes
-- sooner). Denied: retry = until the first live lease expires.
-- Commit: drop expired leases, add the id expiring at now + W, and keep the key until the last
-- lease's expiry. The refund token is the id.
-- Refund: remove the id.
-- Commands: ZCOUNT, ZRANGE of the last expiry (+ ZRANGEBYSCORE of the first live one when
-- denied); on commit ZREMRANGEBYSCORE, ZADD, ZRANGE of the last, PEXPIREAT; on refund ZREM.
local cc_eval, cc_commit, cc_refund, cc_charge
if NEED_1 == '8' or NEED and NEED['8'] then
  -- cc_last returns the expiry of the last lease, or nil.
  local function cc_last(key)
    return tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
  end

  function cc_eval(key, L, W, B, now, cost)
    local n = redis.call('ZCOUNT', key, '(' .. us(now), '+inf')
    local last = cc_last(key)
    local reset = now
    if n > 0 and last and last > now then reset = last end
    if n + 1 <= L then
      local after = now + W
      if after < reset then after = reset end
      return true, n, nonneg(L - n), reset, n + 1, nonneg(L - n - 1), after
    end
    -- Expired leases may not be pruned yet: the first live one is the first past now.
    local first = redis.call('ZRANGEBYSCORE', key, '(' .. us(now), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    return false, n, nonneg(L - n), reset, (tonumber(first[2]) or now) - now
  end

  if MODE ~= '1' then
    function cc_commit(key, L, W, B, now, now_s, cost, Bs, s1, s2, s3, token)
      if not token or token == '' then
        error({err = 'ERR bucket: a concurrency charge without a lease id'})
      end
      redis.call('ZREMRANGEBYSCORE', key, '-inf', now_s)
      redis.call('ZADD', key, us(now + W), token)
      redis.call('PEXPIREAT', key, us(ceil(cc_last(key) / 1000)))
      return token
    end
  end

  if REFUNDS then
    function cc_refund(key, L, W, B, now, cost, charge_now, token)
      if token and token ~= '' then
        redis.call('ZREM', key, token)
      end
    end
  end
end
