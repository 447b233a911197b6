-- A delivery of a transition ended: delivered (the hooks returned), retry (they raised; the
-- queue retries the same message after countdown) or failed (retries exhausted: kept in the
-- failed hash). Only the lease holder may finish it.
-- KEYS: 1 transition outbox, 2 transition payloads, 3 the transition's delivery lease,
--       4 failed transitions hash, 5 claim counts hash
-- ARGV: 1 transition id, 2 owner, 3 outcome (a DELIVERY value), 4 now,
--       5 seconds until a retry may be republished (retry), 6 error JSON (failed)
-- Returns 1, or 0 when the lease is not this delivery's.
local holder = redis.call('GET', KEYS[3])
if holder and holder ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[3])
if ARGV[3] == DELIVERY.RETRY then
  redis.call('ZADD', KEYS[1], 'XX', tonumber(ARGV[4]) + tonumber(ARGV[5]), ARGV[1])
  return 1
end
if ARGV[3] == DELIVERY.FAILED then
  redis.call('HSET', KEYS[4], ARGV[1], ARGV[6])
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
return 1
