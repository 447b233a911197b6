-- Included by claim.lua and complete.lua (its hand-off): the next lease sequence number, from
-- which a claim's lease tokens are made ("<sequence>.<k>").
-- The lease sequence never goes below Redis's clock in microseconds: a counter lost or rolled
-- back by a restore (RDB) starts again above every token issued before, so a new token never
-- equals one a running worker still holds (each claiming call takes more than a microsecond).
local function next_sequence(key)
  local t = redis.call('TIME')
  local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local n = redis.call('INCR', key)
  if n < floor then
    n = floor
    redis.call('SET', key, string.format('%d', n))
  end
  return string.format('%d', n)  -- as text: Lua would print 16 digits as 1.7e+15
end
