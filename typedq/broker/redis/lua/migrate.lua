#!lua flags=allow-oom
-- Move keys of the previous layout (every key under the app prefix P, see keys.py) to
-- the per-queue layout, one chunk per call (typedq/broker/redis/migrate.py drives it).
-- Idempotent and restart-safe: an old key is gone once moved, and the caller runs the
-- steps in order (flows, indexes, jobs, queue keys) until none is left, so a restart
-- begins again with whatever is still in the old layout.
-- KEYS[1] = P seq (the old layout's order counter; deleted by the last step)
-- ARGV: P, step, old order counter value, old key names...
-- Returns how many keys (or entries) it moved.
local step, seq = ARGV[2], tonumber(ARGV[3]) or 0
local moved = 0

-- The queue of a job of the old layout (P j:<id>), nil when there is none.
local function old_queue(id)
  local jk = P .. 'j:' .. id
  local ty = redis.call('TYPE', jk).ok
  if ty == 'hash' then return redis.call('HGET', jk, 'q') or nil end
  if ty == 'string' then
    return string.match(redis.call('GET', jk), '^[ws]([^|]+)|') or nil
  end
  return nil
end

-- Each queue's order counter continues from the old one (FIFO across the migration).
local counted = {}
local function carry_order(q)
  if counted[q] then return end
  counted[q] = true
  local cur = tonumber(redis.call('GET', k_seq(q))) or 0
  if cur < seq then redis.call('SET', k_seq(q), string.format('%d', seq)) end
end

-- Move key `old` to `new`; when `new` exists already, merge (old entries first;
-- `additive`: a hash of counts, added up).
local function move(old, new, additive)
  local ty = redis.call('TYPE', old).ok
  if ty == 'none' then return end
  if redis.call('EXISTS', new) == 0 then
    redis.call('RENAME', old, new)
  elseif ty == 'list' then
    while redis.call('LMOVE', old, new, 'LEFT', 'RIGHT') do end
  elseif ty == 'zset' then
    redis.call('ZUNIONSTORE', new, 2, new, old, 'AGGREGATE', 'MIN')
    redis.call('DEL', old)
  elseif ty == 'set' then
    redis.call('SUNIONSTORE', new, new, old)
    redis.call('DEL', old)
  elseif ty == 'hash' and additive then
    local kv = redis.call('HGETALL', old)
    for i = 1, #kv, 2 do
      if is_int(kv[i + 1]) then redis.call('HINCRBY', new, kv[i], kv[i + 1]) end
    end
    redis.call('DEL', old)
  else
    redis.call('DEL', old)  -- a job or record written in the new layout meanwhile wins
  end
  moved = moved + 1
end

for i = 4, #ARGV do
  local old = ARGV[i]
  local name = string.sub(old, #P + 1)
  if step == 'f' then
    -- A running flow: to the queue of its own job, with its jobs' queues listed.
    local f = string.match(name, '^f:(.*)$')
    local fq = f and old_queue(f)
    if not fq then
      if f then redis.call('DEL', old) end
    else
      local meta = redis.call('HMGET', old, 'S', 'n')
      local steps, n = tonumber(meta[1]) or 0, tonumber(meta[2]) or 0
      local mq, sq = {}, {}
      for m = 0, n - 1 do mq[#mq + 1] = old_queue(f .. '.m' .. m) or fq end
      for k = 0, steps - 1 do sq[#sq + 1] = old_queue(flow_step_id(f, k, steps)) or fq end
      redis.call('HSET', old, 'mq', flow_queue_list(mq), 'sq', flow_queue_list(sq))
      redis.call('HSET', P .. 'mig:fq', f, fq)
      move(old, k_flow(fq, f))
    end
  elseif step == 'z' then
    -- The app-wide active and finished sets: each entry to its job's queue's set.
    local suffix = ({['active'] = 'a', ['done:c'] = 'd:c', ['done:f'] = 'd:f',
      ['done:x'] = 'd:x'})[name]
    if suffix then
      local entries = redis.call('ZRANGE', old, 0, 999, 'WITHSCORES')
      for e = 1, #entries, 2 do
        local q = old_queue(entries[e])
        if q then redis.call('ZADD', k_q(q) .. suffix, entries[e + 1], entries[e]) end
        redis.call('ZREM', old, entries[e])
        moved = moved + 1
      end
    end
  elseif step == 'b' then
    -- Limit buckets: a concurrency bucket's holders and a rate bucket's starts, to
    -- the bucket of their job's queue.
    local kind, bucket = string.match(name, '^(%a%a):(.*)$')
    if kind == 'cc' then
      for _, id in ipairs(redis.call('SMEMBERS', old)) do
        local q = old_queue(id)
        if q then redis.call('SADD', k_slots(q, bucket), id) end
      end
      redis.call('DEL', old)
      moved = moved + 1
    elseif kind == 'rl' then
      local ttl = redis.call('PTTL', old)
      local entries = redis.call('ZRANGE', old, 0, -1, 'WITHSCORES')
      for e = 1, #entries, 2 do
        local id = string.match(entries[e], '^(.*)@%d+$')
        local q = id and old_queue(id)
        if q then
          local task, key = string.match(bucket, '^([^|]*)|(.*)$')
          local rk = k_rate(q, task or bucket, key or '')
          redis.call('ZADD', rk, entries[e + 1], entries[e])
          if ttl > 0 then redis.call('PEXPIRE', rk, ttl) end
        end
      end
      redis.call('DEL', old)
      moved = moved + 1
    end
  elseif step == 'j' then
    -- A job, under its queue; a job of a flow learns where its flow record is.
    local id = string.match(name, '^j:(.*)$')
    local q = id and old_queue(id)
    if id and q then
      carry_order(q)
      if redis.call('TYPE', old).ok == 'hash' then
        local fl = redis.call('HMGET', old, 'fl', 'fq')
        if fl[1] and not fl[2] then
          redis.call('HSET', old, 'fq', redis.call('HGET', P .. 'mig:fq', fl[1]) or q)
        end
      end
      move(old, k_job(q, id))
    elseif id then
      redis.call('DEL', old)  -- bytes no typedq wrote, in no queue
    end
  elseif step == 'q' then
    -- A queue's own keys: P q:<queue>:<suffix> -> {<ns>:<queue>} <suffix>.
    local q, suffix = string.match(name, '^q:([^:]+):(.+)$')
    if q then
      carry_order(q)
      move(old, k_q(q) .. suffix, suffix == 'n' or suffix == 'z')
    else
      redis.call('DEL', old)  -- no key typedq wrote
    end
  elseif step == 'r' then
    redis.call('DEL', old)  -- request records (kept 60 s for re-sent calls)
    moved = moved + 1
  end
end
return moved
