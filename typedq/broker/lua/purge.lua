#!lua flags=allow-oom
-- Delete up to `budget` jobs of one queue in one state; bounded work per call, the
-- client calls again with the returned cursor until it is -1.
-- KEYS[1] = active, KEYS[2] = done:c, KEYS[3] = done:f, KEYS[4] = done:x
-- ARGV: P, queue, state letter, budget, cursor
-- Returns {removed, next cursor or -1}
local q, state, budget, cursor = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
if #ARGV ~= 5 or q == '' or not is_int(budget) or budget < 1 or not is_int(cursor) then
  return bad_args('purge')
end
local removed = 0
local function drop(id)
  local link = flow_link(id)
  redis.call('DEL', k_job(id))
  count(q, state, -1)
  removed = removed + 1
  done_ids[#done_ids + 1] = id
  flow_removed(link, state)
end
local next_cursor = -1
if state == 'w' then
  local seen = 0
  -- Jobs parked by a closed limit gate first (see claim.lua), like list entries.
  local gk = k_gates(q)
  while seen < budget do
    local g = redis.call('ZRANGE', gk, 0, 0)
    if #g == 0 then break end
    local lk = k_gate(q, g[1])
    local popped = redis.call('RPOP', lk, budget - seen) or {}
    for _, e in ipairs(popped) do
      seen = seen + 1
      local prio, id = string.match(e, '^(%-?%d+)|(.*)$')
      if prio and not take_stale(q, prio, id) then
        local r = read_job(id, 's', 'q', 'p')
        if r and r[1] == 'w' and r[2] == q and sane_prio(r[3]) == prio then drop(id) end
      end
    end
    if redis.call('EXISTS', lk) == 0 then redis.call('ZREM', gk, g[1]) end
  end
  while seen < budget do
    local t = redis.call('ZRANGE', k_levels(q), 0, 0)
    if #t == 0 then break end
    local lk = k_wait(q, t[1])
    if redis.call('TYPE', lk).ok ~= 'list' then
      redis.call('ZREM', k_levels(q), t[1])
    else
      local popped = redis.call('RPOP', lk, budget - seen) or {}
      for _, id in ipairs(popped) do
        seen = seen + 1
        -- A counted stale entry is consumed; only a live entry drops its job.
        if not take_stale(q, t[1], id) then
          local r = read_job(id, 's', 'q', 'p')
          if r and r[1] == 'w' and r[2] == q and sane_prio(r[3]) == t[1] then drop(id) end
        end
      end
      if redis.call('EXISTS', lk) == 0 then redis.call('ZREM', k_levels(q), t[1]) end
    end
  end
  if seen >= budget then next_cursor = 0 end
elseif state == 's' then
  local ids = redis.call('ZRANGE', k_sched(q), 0, budget - 1)
  for _, id in ipairs(ids) do
    redis.call('ZREM', k_sched(q), id)
    local r = read_job(id, 's', 'q')
    if r and r[1] == 's' and r[2] == q then drop(id) end
  end
  if #ids >= budget then next_cursor = 0 end
else
  local zkey
  if state == 'a' then zkey = KEYS[1] elseif state == 'c' then zkey = KEYS[2]
  elseif state == 'f' then zkey = KEYS[3] elseif state == 'x' then zkey = KEYS[4]
  else return bad_args('purge') end
  -- Global sets shared by every queue: scan a window, keep the others' entries.
  local ids = redis.call('ZRANGE', zkey, cursor, cursor + budget - 1)
  for _, id in ipairs(ids) do
    local r = read_job(id, 's', 'q', 'ck')
    if r and r[1] == state and r[2] == q then
      redis.call('ZREM', zkey, id)
      if state == 'a' then free_slot(id, q, r[3]) end
      drop(id)
    end
  end
  if #ids >= budget then next_cursor = cursor + budget - removed end
end
flush_counts()
publish()
return {removed, next_cursor}
