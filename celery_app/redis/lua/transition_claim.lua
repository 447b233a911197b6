-- Claim transitions to publish: each id whose outbox score is due moves to now + lease, so
-- exactly one publisher (the worker that made it, or a beat sweeping the outbox) sends it within
-- a lease; one whose delivery neither finished nor renewed it is claimed again after. Each claim
-- of an id doubles its lease (up to ARGV 4), so a queue nobody consumes is not flooded.
-- KEYS: 1 transition outbox, 2 claim counts hash
-- ARGV: 1 now, 2 lease seconds, 3 limit, 4 longest lease seconds,
--       5.. ids (none: the due ids, lowest score first)
-- Returns the claimed ids.
local now = tonumber(ARGV[1])
local ids = {}
if #ARGV >= 5 then
  for i = 5, #ARGV do ids[#ids + 1] = ARGV[i] end
else
  ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
end
local claimed = {}
for _, id in ipairs(ids) do
  local score = redis.call('ZSCORE', KEYS[1], id)
  if score and tonumber(score) <= now then
    local n = redis.call('HINCRBY', KEYS[2], id, 1)
    local lease = math.min(tonumber(ARGV[2]) * 2 ^ math.min(n - 1, 20), tonumber(ARGV[4]))
    redis.call('ZADD', KEYS[1], now + lease, id)
    claimed[#claimed + 1] = id
  end
end
return claimed
