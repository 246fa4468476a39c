-- PUT /v0/entity?id=k<N>, N uniform in [0, KEYSPACE), VALUE_SIZE-byte body.
-- Environment: see common.lua (KEYSPACE, VALUE_SIZE, ACK, FROM).
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local c = dofile(dir .. "common.lua")

function init(args)
  c.seed()
  wrk.headers["Content-Type"] = "application/octet-stream"
end

function request()
  return wrk.format("PUT", c.path(), nil, c.value)
end
