#!lua flags=no-writes
-- Counts per state and the age of the longest-waiting job, per queue (a metrics
-- scrape: one round trip for every queue). The oldest waiting job of a priority level
-- is its head (the right end of its list; the first live entry among the last
-- HEAD_SCAN, stale entries skipped); its age counts from its enqueue time. A due
-- scheduled job not yet moved to waiting counts from its due time.
-- KEYS: the counts hash of each queue (declared for routing; read by name below)
-- ARGV: P, queue...
-- Returns per queue: its counts hash as a flat list, then the age in microseconds.
local HEAD_SCAN = 16
local now = now_us()
local out = {}
for i = 2, #ARGV do
  local q = ARGV[i]
  local oldest = nil
  for _, prio in ipairs(redis.call('ZRANGE', k_levels(q), 0, -1)) do
    local lk = k_wait(q, prio)
    if redis.call('TYPE', lk).ok == 'list' then
      local ids = redis.call('LRANGE', lk, -HEAD_SCAN, -1)
      for j = #ids, 1, -1 do
        local r = read_job(q, ids[j], 's', 'e')
        if r and r[1] == 'w' then
          local e = tonumber(r[2])
          if e and (not oldest or e < oldest) then oldest = e end
          break
        end
      end
    end
  end
  local due = redis.call('ZRANGEBYSCORE', k_sched(q), '-inf', now, 'WITHSCORES', 'LIMIT', 0, 1)
  if due[2] then
    local d = tonumber(due[2])
    if d and (not oldest or d < oldest) then oldest = d end
  end
  local age = 0
  if oldest and oldest < now then age = now - oldest end
  out[#out + 1] = redis.call('HGETALL', k_counts(q))
  out[#out + 1] = age
end
return out
