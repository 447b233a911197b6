-- Raise the lease sequence counter to at least ARGV[1] (never lower it): reconcile passes the
-- highest sequence number of the lease tokens jobs still hold, so a counter a restore lost or
-- rolled back can never issue one of them again.
-- KEYS: 1 the lease sequence counter. ARGV: 1 the floor (an integer, as text).
-- Returns the counter's value afterwards, as text.
local floor = tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < floor then
  redis.call('SET', KEYS[1], ARGV[1])
  return ARGV[1]
end
return string.format('%d', current)
