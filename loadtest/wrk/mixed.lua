-- Mixed GET/PUT on uniform keys k<N>, N in [0, KEYSPACE): each request is a
-- GET with probability READ_RATIO (default 0.9), otherwise a PUT of a
-- VALUE_SIZE-byte body. Environment: see common.lua.
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local c = dofile(dir .. "common.lua")

local read_ratio = tonumber(os.getenv("READ_RATIO") or "") or 0.9
local put_headers = { ["Content-Type"] = "application/octet-stream" }

function init(args)
  c.seed()
end

function request()
  if math.random() < read_ratio then
    return wrk.format("GET", c.path())
  end
  return wrk.format("PUT", c.path(), put_headers, c.value)
end
