-- Shared by put.lua, get.lua and mixed.lua (loaded with dofile from the
-- scripts' own directory). Keys are those dhtkv-load --fill N writes:
--   KEYSPACE    number of distinct ids, keys are "k0".."k<KEYSPACE-1>" (default 1000000)
--   VALUE_SIZE  value size in bytes (default 1024)
--   ACK, FROM   replication parameters, appended as &ack=..&from=.. when set
--               (unset, empty or 0 = omitted, as with dhtkv-load's --ack/--from)
-- done() prints one machine-readable line:
--   WRKRESULT requests=<n> duration_us=<n> rps=<f> p50_ms=<f> p99_ms=<f>
--             errors=<n> status_err=<n> connect=<n> read=<n> write=<n> timeout=<n>
local M = {}

M.keyspace = tonumber(os.getenv("KEYSPACE") or "") or 1000000
M.value_size = tonumber(os.getenv("VALUE_SIZE") or "") or 1024
M.value = string.rep("v", M.value_size)

local function param(name, env)
  local v = tonumber(os.getenv(env) or "")
  if v and v > 0 then
    return "&" .. name .. "=" .. string.format("%d", v)
  end
  return ""
end
local suffix = param("ack", "ACK") .. param("from", "FROM")

local nthreads = 0

function setup(thread)
  nthreads = nthreads + 1
  thread:set("tid", nthreads)
end

function M.seed()
  -- distinct per-thread sequence
  math.randomseed(os.time() * 1000 + (tid or 0) * 7919)
  for _ = 1, 10 do math.random() end
end

function M.path()
  return "/v0/entity?id=k" .. math.random(0, M.keyspace - 1) .. suffix
end

function done(summary, latency, requests)
  local e = summary.errors
  local errs = e.connect + e.read + e.write + e.status + e.timeout
  local secs = summary.duration / 1e6
  io.write(string.format(
    "WRKRESULT requests=%d duration_us=%d rps=%.1f p50_ms=%.3f p99_ms=%.3f errors=%d status_err=%d connect=%d read=%d write=%d timeout=%d\n",
    summary.requests, summary.duration, summary.requests / secs,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000,
    errs, e.status, e.connect, e.read, e.write, e.timeout))
end

return M
