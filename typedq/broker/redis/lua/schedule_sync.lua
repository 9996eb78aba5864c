#!lua
-- Reconcile schedule states with the definitions a worker declares (typedq.schedule),
-- atomically: a schedule with no state, or a state of another digest, starts afresh at
-- the Redis clock's now (nothing fires from stale state); an equal digest keeps its
-- state. With prune, the states of schedules not listed are deleted (bounded state:
-- one field per declared schedule).
-- KEYS[1] = schedules hash
-- ARGV: P, prune ('0' | '1'), n, then n x (name, digest)
-- Returns the n states, in order ('digest|last|fired_at|fired|skipped|last_job'), then
-- the names pruned (on Redis Cluster the caller deletes their firing states, which live
-- in their queues' slots).
local n = tonumber(ARGV[3])
if not is_int(n) or n < 0 or #ARGV ~= 3 + 2 * n or (ARGV[2] ~= '0' and ARGV[2] ~= '1') then
  return bad_args('schedule_sync')
end
local listed = {}
for i = 0, n - 1 do
  local name, digest = ARGV[4 + 2 * i], ARGV[5 + 2 * i]
  if name == '' or digest == '' or string.find(digest, '|', 1, true) then
    return bad_args('schedule_sync')
  end
  listed[name] = true
end
local pruned = {}
if ARGV[2] == '1' then
  for _, name in ipairs(redis.call('HKEYS', KEYS[1])) do
    if not listed[name] then
      redis.call('HDEL', KEYS[1], name)
      pruned[#pruned + 1] = name
    end
  end
end
local now = string.format('%d', now_us())
local out = {}
for i = 0, n - 1 do
  local name, digest = ARGV[4 + 2 * i], ARGV[5 + 2 * i]
  local cur = redis.call('HGET', KEYS[1], name)
  if not cur or string.sub(cur, 1, #digest + 1) ~= digest .. '|' then
    cur = digest .. '|' .. now .. '|0|0|0|'
    redis.call('HSET', KEYS[1], name, cur)
  end
  out[i + 1] = cur
end
for _, name in ipairs(pruned) do out[#out + 1] = name end
return out
