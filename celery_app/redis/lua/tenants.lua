-- Read-only: the tenant of each job. A claim's first phase needs them when too many tenants are
-- rate-limited to declare all of their buckets (celery_app.checks.claiming): it then declares
-- the buckets of the candidates' tenants only.
-- KEYS: the job hashes. ARGV: none.
-- Returns ONE string, a line per job in KEYS order: its tenant, '' when the job is gone
-- (tenants hold no whitespace; one bulk reply parses far faster than one per job).
local out = {}
for i = 1, #KEYS do
  out[i] = redis.call('HGET', KEYS[i], JOB.TENANT) or ''
end
return table.concat(out, '\n')
