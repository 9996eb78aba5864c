#!lua flags=allow-oom
-- Delete up to `budget` jobs of one queue in one state; bounded work per call, the
-- client calls again with the returned cursor until it is -1. The budget is in entries
-- of a plain job's cost (~5-10 µs of Redis time): a deleted job of a flow costs 3 (its
-- link read, its flow's record read), 7 when it settles a member of a flow not ended;
-- a job a flow's end passes costs 2 (bench/fanout_scripts.py --purges). A call stops
-- once the budget is spent (past it by at most one flow end's first chunk,
-- flow_ops.END_CHUNK jobs), and a flow's end goes on in steps the client applies after
-- (flow_end in common/flow_settle.lua).
-- KEYS[1] = the queue's active zset
-- ARGV: P, queue, state letter, budget, cursor[, the letters of every state this purge
--   deletes (default: the state's own)]
-- Returns {removed, next cursor or -1}
local q, state, budget, cursor = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
if (#ARGV ~= 5 and #ARGV ~= 6) or q == '' or not is_int(budget) or budget < 1
    or not is_int(cursor) then
  return bad_args('purge')
end
local removed = 0
-- A waiting or scheduled job of a flow that a deletion here ends or releases, in one of
-- the purged states on this queue, is deleted as well (purge_takes in common/flow_settle.lua) and
-- counted: what the embedded broker does, which deletes them all before any flow reacts.
purging = {q = q, n = 0, states = {[state] = true}, letters = ARGV[6] or state, spent = 0,
  budget = budget}
for letter in string.gmatch(ARGV[6] or '', '%a') do purging.states[letter] = true end
-- What is left of the budget (entries passed and the work of the flows they end, as
-- weighed above).
local function room() return math.floor(budget - purging.spent) end
-- Entries popped off list `lk` and not passed (`popped` from `from` on) go back on it,
-- in their order.
local function push_back(lk, popped, from)
  for k = #popped, from, -1 do redis.call('RPUSH', lk, popped[k]) end
end
local function drop(id)
  local link = flow_link(q, id)
  if link then purging.spent = purging.spent + 2 end
  redis.call('DEL', k_job(q, id))
  count(q, state, -1)
  removed = removed + 1
  note_done(q, id)
  flow_removed(link, state)
end
local next_cursor = -1
if state == 'w' then
  local full = false
  -- Jobs parked by a closed limit gate first (see common/gates.lua), like list entries.
  local gk = k_gates(q)
  while room() > 0 do
    local g = redis.call('ZRANGE', gk, 0, 0)
    if #g == 0 then break end
    local lk = k_gate(q, g[1])
    local popped = redis.call('RPOP', lk, room()) or {}
    for j, e in ipairs(popped) do
      if room() <= 0 then push_back(lk, popped, j); break end
      purging.spent = purging.spent + 1
      local prio, id = string.match(e, '^(%-?%d+)|(.*)$')
      if prio and not take_stale(q, prio, id) then
        redis.call('HDEL', k_parked(q), id)
        local r = read_keyed(q, id, 's', 'q', 'p')
        if r and r[1] == 'w' and r[2] == q and sane_prio(r[3]) == prio then drop(id) end
      end
    end
    if redis.call('EXISTS', lk) == 0 then redis.call('ZREM', gk, g[1]) end
  end
  while room() > 0 and not full do
    local t = redis.call('ZRANGE', k_levels(q), 0, 0)
    if #t == 0 then break end
    local lk = k_wait(q, t[1])
    if redis.call('TYPE', lk).ok ~= 'list' then
      redis.call('ZREM', k_levels(q), t[1])
    else
      local popped = redis.call('RPOP', lk, room()) or {}
      for j, id in ipairs(popped) do
        if room() <= 0 then push_back(lk, popped, j); full = true; break end
        purging.spent = purging.spent + 1
        -- A counted stale entry is consumed; only a live entry drops its job.
        local _, _, group = marker_parts(id)
        if group then
          -- A fair key's marker (common/lanes.lua): its lane's jobs go too, within the
          -- budget; a lane not emptied keeps its marker, at the head.
          local fk = k_lane(q, group, t[1])
          local ids = redis.call('RPOP', fk, math.max(1, room())) or {}
          for i, fid in ipairs(ids) do
            if room() <= 0 then push_back(fk, ids, i); break end
            purging.spent = purging.spent + 1
            if not take_stale(q, t[1], fid) then
              local r = read_keyed(q, fid, 's', 'q', 'p')
              if r and r[1] == 'w' and r[2] == q and sane_prio(r[3]) == t[1] then drop(fid) end
            end
          end
          if redis.call('EXISTS', fk) == 1 then
            push_back(lk, popped, j + 1)
            redis.call('RPUSH', lk, id)
            full = true
            break
          end
          redis.call('HDEL', k_lanes(q), t[1] .. '|' .. group)
          redis.call('SREM', k_lanes(q, true), t[1] .. '|' .. group)
        elseif not is_bare(id) then
          local f = parse_entry(id)
          if f and entry_live(q, t[1], f) then
            redis.call('HDEL', f.ik, f.id)
            count(q, state, -1)
            removed = removed + 1
            note_done(q, f.id)
          end
        elseif not take_stale(q, t[1], id) then
          local r = read_keyed(q, id, 's', 'q', 'p')
          if r and r[1] == 'w' and r[2] == q and sane_prio(r[3]) == t[1] then drop(id) end
        end
      end
      if redis.call('EXISTS', lk) == 0 then redis.call('ZREM', k_levels(q), t[1]) end
    end
  end
  if full or room() <= 0 then next_cursor = 0 end
elseif state == 's' then
  local ids = redis.call('ZRANGE', k_sched(q), 0, budget - 1)
  for _, id in ipairs(ids) do
    if room() <= 0 then break end
    purging.spent = purging.spent + 1
    redis.call('ZREM', k_sched(q), id)
    local r = read_job(q, id, 's', 'q')
    if r and r[1] == 's' and r[2] == q then drop(id) end
  end
  if #ids >= budget or room() <= 0 then next_cursor = 0 end
else
  local zkey
  if state == 'a' then zkey = k_active(q)
  elseif state == 'c' or state == 'f' or state == 'x' then zkey = k_done(q, state)
  else return bad_args('purge') end
  -- The queue's own set: entries of jobs in another state (garbage) are kept.
  local ids = redis.call('ZRANGE', zkey, cursor, cursor + budget - 1)
  local passed = 0
  for _, id in ipairs(ids) do
    if room() <= 0 then break end
    purging.spent = purging.spent + 1
    passed = passed + 1
    local r = read_job(q, id, 's', 'q', 'ck')
    if r and r[1] == state then
      -- An active job's handler may still run: its slot is held until its lease ends.
      local lease_until = state == 'a' and redis.call('ZSCORE', zkey, id)
      redis.call('ZREM', zkey, id)
      if state == 'a' then ghost_slot(id, q, r[3], lease_until) end
      drop(id)
    end
  end
  if #ids >= budget or passed < #ids then next_cursor = cursor + passed - removed end
end
removed = removed + purging.n
flush_counts()
publish()
return flow_reply({removed, next_cursor})
