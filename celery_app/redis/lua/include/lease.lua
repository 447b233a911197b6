-- Included by claim.lua, complete.lua and store.lua: whether a job's JOB.LEASE_TOKEN (as HGET or
-- HMGET answers it) is a lease. A job that holds none has the field empty, as a completion
-- leaves it (writing '' in the HSET of its run releases the lease without an HDEL), or absent
-- (a new job; release, abandon and quarantine delete it).
local function holds_lease(token)
  return token ~= nil and token ~= false and token ~= ''
end
