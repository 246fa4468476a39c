-- GET /v0/entity?id=k<N>, N uniform in [0, KEYSPACE). Set KEYSPACE to the
-- number of prefilled keys (e.g. dhtkv-load --fill) so every GET is a hit.
-- Environment: see common.lua (KEYSPACE, ACK, FROM).
local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local c = dofile(dir .. "common.lua")

function init(args)
  c.seed()
end

function request()
  return wrk.format("GET", c.path())
end
