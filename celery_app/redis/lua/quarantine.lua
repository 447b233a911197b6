-- Set one job aside: its data made a dispatch step fail (checks.quarantine). The job leaves
-- every index and its lease, so no tick sees it again; its record is written into its hash and
-- its id into the quarantine set; the hash stays for inspection until the job is released
-- (rebuilt). Idempotent.
-- KEYS: 1 job hash, 2 quarantine set, 3 due zset, 4 ready fast, 5 ready slow, 6 leases fast,
--       7 leases slow, then any number of held indexes that may hold it (its tenants').
-- ARGV: 1 job id, 2 the record JSON.
-- Returns 1 when the job was not quarantined before, 0 when only its record was replaced.
local id = ARGV[1]
for k = 3, #KEYS do redis.call('ZREM', KEYS[k], id) end
redis.call('HDEL', KEYS[1], JOB.LEASE_TOKEN, JOB.LEASE_EXPIRY)
redis.call('HSET', KEYS[1], JOB.QUARANTINE, ARGV[2])
return redis.call('SADD', KEYS[2], id)
