-- A delivery of a transition starts: run the hooks only if it is still undelivered and no other
-- delivery holds it; take the delivery lease (SET PX, owner = the Celery task id, so the same
-- message redelivered after its worker died takes it over) and keep beat from republishing it
-- while the hooks run.
-- KEYS: 1 transition outbox, 2 transition payloads, 3 the transition's delivery lease
-- ARGV: 1 transition id, 2 owner (Celery task id), 3 lease ms, 4 now
-- Returns {TRANSITION_START.RUN, payload JSON} | {TRANSITION_START.DONE} | {TRANSITION_START.BUSY}
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return {TRANSITION_START.DONE} end
local holder = redis.call('GET', KEYS[3])
if holder and holder ~= ARGV[2] then return {TRANSITION_START.BUSY} end
local payload = redis.call('HGET', KEYS[2], ARGV[1])
if not payload then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return {TRANSITION_START.DONE}
end
redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3])
redis.call('ZADD', KEYS[1], tonumber(ARGV[4]) + tonumber(ARGV[3]) / 1000.0, ARGV[1])
return {TRANSITION_START.RUN, payload}
