#!lua flags=allow-oom
-- Cancel a waiting or scheduled job, or ask the worker running it to cancel it.
-- A re-sent call (same request record) returns the first copy's answer.
-- KEYS[1] = this call's request record (on the job's queue's slot)
-- ARGV: P, queue, failed_ttl_us, failed_max, id
-- Returns 'cancelled', 'requested', 'already_final' or 'not_found'.
local q, ttl, cap, id = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
if not ttl or not is_int(cap) or #ARGV ~= 5 or id == '' or q == '' then return bad_args('cancel') end
local prev = redis.pcall('GET', KEYS[1])
if prev == 'cancelled' or prev == 'requested' then return prev end
local r = read_job(q, id, 's', 'q', 'a', 'p', 'pk')
if not r then return 'not_found' end
local s = r[1]
-- A parked job (failed, its flow waiting for it: fail.lua's 'p') is cancelled as a
-- waiting one would be: its flow ends as cancelled.
local parked = s == 'f' and r[5]
if (s == 'c' or s == 'f' or s == 'x') and not parked then return 'already_final' end
if s == 'a' then
  redis.call('HSET', k_job(q, id), 'cr', 1)
  redis.call('SET', KEYS[1], 'requested', 'PX', REQ_TTL_MS)
  publish_cancel(q, id)
  return 'requested'
end
if s ~= 'w' and s ~= 's' and not parked then return 'not_found' end
local now = now_us()
local state_name = 'waiting'
if parked then
  state_name = 'parked'
  redis.call('HDEL', k_job(q, id), 'pk')
  redis.call('ZREM', k_done(q, 'f'), id)
end
if s == 's' then
  state_name = 'scheduled'
  redis.call('ZREM', k_sched(q), id)
end
-- A waiting job with a key of its own leaves its bare list entry behind, counted as
-- stale; claim skips it (lazy deletion keeps cancel O(1) on long queues). A waiting
-- entry is found (O(log n), see find_entry) and left as '|'. A job string or waiting
-- entry becomes the hash its final state needs.
if s == 'w' and redis.call('EXISTS', k_job(q, id)) == 1 then mark_stale(q, sane_prio(r[4]), id) end
to_hash(q, id)
redis.call('HSET', k_job(q, id), 'err', failure_record(
  CANCELLED_REASON, CANCELLED_TYPE, CANCELLED_WHILE .. state_name, tonumber(r[3]) or 0, nil, now))
finalize(id, q, s, 'x', now)
trim(q, 'x', now, ttl, cap, 100)
redis.call('SET', KEYS[1], 'cancelled', 'PX', REQ_TTL_MS)
flush_counts()
publish()
return flow_reply('cancelled')
