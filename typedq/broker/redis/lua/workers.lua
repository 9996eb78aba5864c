#!lua flags=no-writes
-- Read the registries: 'w' the infos of the workers whose heartbeat has not expired
-- (by id, at most 10000); 'q' every registered queue.
-- KEYS[1] = workers (zset id -> expiry, µs), KEYS[2] = queues (set)
-- ARGV: P, what
if ARGV[2] == 'q' then return redis.call('SMEMBERS', KEYS[2]) end
if ARGV[2] ~= 'w' then return bad_args('workers') end
local now = now_us()
local out = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'LIMIT', 0, 10000)) do
  local v = redis.call('GET', k_worker(id))
  if v then out[#out + 1] = v end
end
return out
