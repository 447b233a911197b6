-- Read-only: whether work waits in one region (a job due, ready or held work), in one
-- command (celery_app.checks.dispatch RefillNeeds): queued on the post-exec write's own round
-- trip after every run, so three pipelined commands were three to pack and three replies to
-- parse on every run.
-- KEYS: 1 due zset, 2 ready fast, 3 ready slow, 4 the region's held tenants
-- Returns {this server's TIME {seconds, micros}, the first due job {id, score} or {},
--          how many of KEYS 2-4 exist}
return {redis.call('TIME'), redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES'),
        redis.call('EXISTS', KEYS[2], KEYS[3], KEYS[4])}
