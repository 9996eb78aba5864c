#!lua flags=allow-oom
-- The worker registry. 'beat': store a worker's info for ttl ms (a heartbeat) and add
-- its queues to the queue registry; 'drop': remove it (a clean shutdown). Either way,
-- expired entries of the index are pruned (bounded). allow-oom: a worker draining a
-- full Redis stays listed (an entry replaces the last one: one small key per worker).
-- KEYS[1] = workers (zset id -> expiry, µs), KEYS[2] = queues (set)
-- ARGV: P, op, worker id, ttl (ms), info (msgpack WorkerInfo), queue...
local op, id, ttl = ARGV[2], ARGV[3], tonumber(ARGV[4])
if id == nil or id == '' or (op ~= 'beat' and op ~= 'drop') then return bad_args('worker') end
local now = now_us()
local wk = k_worker(id)
if op == 'beat' then
  if not is_int(ttl) or ttl <= 0 or ARGV[5] == nil then return bad_args('worker') end
  redis.call('SET', wk, ARGV[5], 'PX', ttl)
  redis.call('ZADD', KEYS[1], now + ttl * 1000, id)
  for i = 6, #ARGV do redis.call('SADD', KEYS[2], ARGV[i]) end
else
  redis.call('DEL', wk)
  redis.call('ZREM', KEYS[1], id)
end
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 100)
for _, g in ipairs(gone) do
  redis.call('ZREM', KEYS[1], g)
  redis.call('DEL', k_worker(g))
end
return 1
