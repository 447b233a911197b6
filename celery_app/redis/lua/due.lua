-- Read-only: the ids of up to ARGV[2] jobs due at ARGV[1] (score <= ARGV[1]), for the first
-- phase of a promote (celery_app.checks.claiming.promote_due, promote_and_read).
-- KEYS: 1 due zset. ARGV: 1 through, 2 how many, 3 (optional) now, at most through.
-- Returns ONE string, the job ids separated by '\n' (they hold no whitespace); with ARGV[3],
-- {that string, how many of them are due at now} (they come first: the index is in due order),
-- so beat's tick reads the due index once for what is due and what its lead holds.
local through, n = ARGV[1], tonumber(ARGV[2])
if ARGV[3] == nil then
  return table.concat(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', through, 'LIMIT', 0, n), '\n')
end
local now = tonumber(ARGV[3])
local pairs_ = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', through, 'WITHSCORES', 'LIMIT', 0, n)
local ids, due_now = {}, 0
for i = 1, #pairs_, 2 do
  ids[#ids + 1] = pairs_[i]
  if tonumber(pairs_[i + 1]) <= now then due_now = due_now + 1 end
end
return {table.concat(ids, '\n'), due_now}
