-- Included by complete.lua: whether a job hash is exactly as a worker read it when its run
-- started (apart from the lease, which the caller checks by token). The worker planned its
-- write from that read (celery_app.checks.jobs.ReadGuard): an edit, a pause or a quorum
-- transition since then makes it read again instead of writing numbers planned from old ones.
-- hlen: the HLEN it read; names: its field names, space-separated; expected: their values as
-- read, each as '<byte length> <value>', concatenated (a value may hold any byte).
local function job_unchanged(key, hlen, names, expected)
  if redis.call('HLEN', key) ~= tonumber(hlen) then return false end
  local fields = {}
  for f in string.gmatch(names, '%S+') do fields[#fields + 1] = f end
  if #fields == 0 then return expected == '' end
  local values = redis.call('HMGET', key, unpack(fields))
  local parts = {}
  for i = 1, #fields do
    local v = values[i]
    if not v then return false end
    parts[i] = #v .. ' ' .. v
  end
  return table.concat(parts) == expected
end
