-- quotaflow for HAProxy 2.6+: the action lua.quotaflow_check asks the checker's forward-auth
-- endpoint (GET /ratelimit/check) about each request, and leaves the answer in variables that
-- haproxy.cfg turns into a 429 or into response headers:
--
--   txn.qf_denied    true when the checker denied the request (429)
--   txn.qf_failed    true when the checker could not answer (down, timed out, a 5xx)
--   txn.qf_ratelimit, txn.qf_policy, txn.qf_limit, txn.qf_remaining, txn.qf_reset,
--   txn.qf_state, txn.qf_retry_after, txn.qf_decision_id   the answer's headers, when present
--
-- An allowed request that a rule with on_limit: delay queued waits its X-Quotaflow-Delay-Ms
-- here before going on.
--
-- Any other answer (a 4xx: the checker refused the check, e.g. a path over its bound) is the
-- client's answer as the checker wrote it, status and JSON body: the request is refused,
-- whatever the fail mode.
--
-- No header of the client's reaches the checker: the check carries the endpoint and the
-- connection's address, and the user and API key in txn.qf_user and txn.qf_api_key, which
-- haproxy.cfg sets from what HAProxy authenticated (empty: none).
--
-- The checker's address comes from the environment: QUOTAFLOW_CHECKER (host:port, default
-- 127.0.0.1:8080).
--
-- It speaks HTTP/1.0 over core.tcp() rather than core.httpclient(): HAProxy 2.6's httpclient
-- retries a refused connection 3 times a second apart, ignoring the request's timeout, and has
-- no setting for it (httpclient.retries and httpclient.timeout.connect came later), so a checker
-- that is down would hold every request for 3 s before the fail mode applied.

local checker = os.getenv("QUOTAFLOW_CHECKER") or "127.0.0.1:8080"
local checker_host, checker_port = checker:match("^%[?([^%]]+)%]?:(%d+)$")
checker_port = tonumber(checker_port)

-- A checker that does not answer within a second counts as down.
local timeout = 1
-- The largest refusal body passed on to the client; the checker's are a few hundred bytes.
local max_body = 16384
-- The subjects HAProxy authenticated: the variables haproxy.cfg sets, and their headers.
local subjects = { ["txn.qf_user"] = "X-User-Id", ["txn.qf_api_key"] = "X-Api-Key" }

-- The answer's headers and the variables that keep them.
local kept = {
  ["ratelimit"] = "txn.qf_ratelimit",
  ["ratelimit-policy"] = "txn.qf_policy",
  ["x-ratelimit-limit"] = "txn.qf_limit",
  ["x-ratelimit-remaining"] = "txn.qf_remaining",
  ["x-ratelimit-reset"] = "txn.qf_reset",
  ["x-ratelimit-state"] = "txn.qf_state",
  ["retry-after"] = "txn.qf_retry_after",
  ["x-quotaflow-decision-id"] = "txn.qf_decision_id",
}

-- check sends one check and returns its status and headers (names lowercased), or nil when the
-- checker could not be asked or its answer could not be read.
local function check(headers)
  if checker_port == nil then
    return nil
  end
  local sock = core.tcp()
  sock:settimeout(timeout)
  if not sock:connect(checker_host, checker_port) then
    sock:close()
    return nil
  end
  local lines = { "GET /ratelimit/check HTTP/1.0", "Host: " .. checker }
  for name, v in pairs(headers) do
    lines[#lines + 1] = name .. ": " .. v
  end
  lines[#lines + 1] = "\r\n"
  if not sock:send(table.concat(lines, "\r\n")) then
    sock:close()
    return nil
  end
  local line = sock:receive("*l")
  local status = line and tonumber(line:match("^HTTP/%d%.%d (%d%d%d)"))
  if status == nil then
    sock:close()
    return nil
  end
  local res = { status = status, headers = {} }
  while true do
    line = sock:receive("*l")
    if line == nil then
      sock:close()
      return nil
    end
    line = line:gsub("\r$", "")
    if line == "" then
      break
    end
    local name, value = line:match("^([^:]+):%s*(.-)%s*$")
    if name ~= nil then
      res.headers[name:lower()] = value
    end
  end
  -- A refusal's body goes to the client; an allow or a denial's is not needed.
  local length = tonumber(res.headers["content-length"])
  if res.status >= 300 and res.status ~= 429 and length ~= nil and length > 0 and length <= max_body then
    res.body = sock:receive(length)
  end
  sock:close()
  return res
end

-- refuse answers the request with the checker's refusal: its status, content type and body.
local function refuse(txn, res)
  local reply = txn:reply()
  reply:set_status(res.status)
  reply:add_header("content-type", res.headers["content-type"] or "application/json")
  reply:set_body(res.body or "")
  txn:done(reply)
end

core.register_action("quotaflow_check", { "http-req" }, function(txn)
  local headers = {
    -- The endpoint (the checker drops the query string) and the client's address, which the
    -- checker believes only from a proxy in its --trusted-proxies.
    ["X-Forwarded-Uri"] = txn.f:pathq(),
    ["X-Forwarded-For"] = txn.f:src(),
  }
  for var, name in pairs(subjects) do
    local v = tostring(txn:get_var(var) or "")
    if v ~= "" then
      -- A line break would end the header early and start one of the value's choosing.
      if v:find("[\r\n]") then
        refuse(txn, { status = 400, headers = {}, body = '{"error":"invalid_argument","message":"' .. name .. ': must not contain a line break"}\n' })
        return
      end
      headers[name] = v
    end
  end
  local res = check(headers)
  if res == nil or res.status >= 500 then
    txn:set_var("txn.qf_failed", true)
    return
  end
  if res.status ~= 429 and (res.status < 200 or res.status > 299) then
    refuse(txn, res)
    return
  end
  for name, v in pairs(res.headers) do
    local var = kept[name]
    if var ~= nil then
      txn:set_var(var, v)
    end
  end
  if res.status == 429 then
    txn:set_var("txn.qf_denied", true)
    return
  end
  -- A rule with on_limit: delay queued the request: it goes on at its slot, once this action
  -- has slept the delay the checker gave (core.msleep yields: other requests go on meanwhile).
  local delay = tonumber(res.headers["x-quotaflow-delay-ms"])
  if delay ~= nil and delay > 0 then
    core.msleep(delay)
  end
end)
