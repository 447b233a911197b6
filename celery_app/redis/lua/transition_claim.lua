-- Claim transitions to publish: each id whose outbox score is due moves to now + lease, so
-- exactly one publisher (the worker that made it, or a beat sweeping the outbox) sends it within
-- a lease; one whose delivery neither finished nor renewed it is claimed again after.
-- KEYS: 1 transition outbox
-- ARGV: 1 now, 2 lease seconds, 3 limit, 4.. ids (none: the due ids, lowest score first)
-- Returns the claimed ids.
local now = tonumber(ARGV[1])
local ids = {}
if #ARGV >= 4 then
  for i = 4, #ARGV do ids[#ids + 1] = ARGV[i] end
else
  ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
end
local claimed = {}
for _, id in ipairs(ids) do
  local score = redis.call('ZSCORE', KEYS[1], id)
  if score and tonumber(score) <= now then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), id)
    claimed[#claimed + 1] = id
  end
end
return claimed
