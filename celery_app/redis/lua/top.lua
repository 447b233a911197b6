-- Read-only: the first entries of sorted sets (ready or held indexes) with their scores, for
-- the first phase of a claim (celery_app.checks.claiming).
-- KEYS: the sorted sets. ARGV: how many entries to read from each, in KEYS order (0: none).
-- Returns one string per key: "member score member score ..." in index order (members are job
-- ids, which hold no whitespace; one bulk reply parses far faster than two per entry).
local out = {}
for i = 1, #KEYS do
  local n = tonumber(ARGV[i])
  out[i] = ''
  if n > 0 then
    out[i] = table.concat(redis.call('ZRANGE', KEYS[i], 0, n - 1, 'WITHSCORES'), ' ')
  end
end
return out
