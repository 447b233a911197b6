-- Included by claim.lua: the next lease sequence number, from
-- which a claim's lease tokens are made ("<sequence>.<k>").
-- The lease sequence never goes below Redis's clock in microseconds, and never repeats: a
-- counter lost or rolled back by a restore (RDB) starts again above every token issued before,
-- so a new token never equals one a running worker still holds; a clock stepped back goes on
-- from the counter.
local function next_sequence(key)
  local t = redis.call('TIME')
  local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
  -- one command, unless a call in the same microsecond or a clock stepped back came first
  local old = tonumber(redis.call('SET', key, string.format('%d', floor), 'GET'))
  if old and old >= floor then
    floor = old + 1
    redis.call('SET', key, string.format('%d', floor))
  end
  return string.format('%d', floor)  -- as text: Lua would print 16 digits as 1.7e+15
end
