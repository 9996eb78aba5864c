#!lua
-- Fire ticks of one schedule (typedq.schedule), atomically and at most once: only if
-- the schedule's state still holds the definition digest and last tick the scheduler
-- read (compare and set), apply the overlap policy against the job of the newest fired
-- tick, enqueue the ticks' jobs (waiting now; an existing id is not replaced) and move
-- the state to the new last tick, all in this one script. Ticks are never fired before
-- their time by the Redis clock. Refused at maxmemory (it adds jobs).
-- The state is one field of the schedules hash: 'digest|last|fired_at|fired|skipped|last_job'
-- (integer µs of the Redis clock; job ids hold no '|').
-- KEYS[1] = schedules hash (app-wide), KEYS[2] = the order counter of the jobs' queue
-- ARGV: P, max_queue_length, name, digest, expected_last, new_last, skipped, overlap,
--       n, then n x (id, queue, priority, body), then on Redis Cluster the app-wide state
--       the scheduler read (adopt, below)
-- On Redis Cluster the state fired here is the schedule's firing state in the slot of
-- its tick jobs' queue (KEYS[1] = that queue's 'S' hash: every tick of a schedule goes
-- to one queue), so the check, the overlap policy, the enqueue and the move are one
-- script there too; the app-wide state is then moved up to it (schedule_commit.lua). A
-- firing state that is missing, of another digest, or behind the app-wide one (a
-- reconciliation restarted it) first takes the app-wide state given (adopt); one ahead
-- of it answers stale (the tick was fired; the caller moves the app-wide state up).
-- Returns {outcome, state or false}: outcome 'fired' | 'stale' | 'overlap_skipped' |
-- 'held' | 'full'.
local limit, n = tonumber(ARGV[2]), tonumber(ARGV[9])
local name, digest, overlap = ARGV[3], ARGV[4], ARGV[8]
local adopt = is_int(n) and n >= 0 and ARGV[10 + 4 * n]
if not limit or not is_int(n) or n < 0 or #ARGV > 10 + 4 * n or #ARGV < 9 + 4 * n
    or name == '' or (adopt and string.sub(adopt, 1, #ARGV[4] + #ARGV[5] + 2)
      ~= ARGV[4] .. '|' .. ARGV[5] .. '|')
    or not is_int(ARGV[5]) or not is_int(ARGV[6]) or not is_int(ARGV[7])
    or (overlap ~= 'allow' and overlap ~= 'skip' and overlap ~= 'queue') then
  return bad_args('schedule_fire')
end
for i = 0, n - 1 do
  local b = 10 + 4 * i
  if ARGV[b] == '' or ARGV[b + 1] == '' or string.find(ARGV[b + 1], '|', 1, true)
      or not is_int(ARGV[b + 2]) then
    return bad_args('schedule_fire')
  end
end

if adopt then
  local cur = rcall('HGET', KEYS[1], name)
  local d, l = string.match(cur or '', '^([^|]*)|(%-?%d+)|')
  if d ~= digest or tonumber(l) < tonumber(ARGV[5]) then rcall('HSET', KEYS[1], name, adopt) end
end
local st = schedule_state(KEYS[1], name, digest, ARGV[5], ARGV[6])
if st.stale then return st.stale end
local cur, fired_at, fired, last_job, now = st.cur, st.fired_at, st.fired, st.last_job, st.now
local skipped = st.skipped + tonumber(ARGV[7])

local function save(outcome)
  local state = digest .. '|' .. ARGV[6] .. '|' .. fired_at .. '|' .. string.format('%d', fired)
    .. '|' .. string.format('%d', skipped) .. '|' .. last_job
  redis.call('HSET', KEYS[1], name, state)
  return {outcome, state}
end

if n > 0 and overlap ~= 'allow' and last_job ~= '' then
  local r = read_job(ARGV[11], last_job, 's')
  if r and (r[1] == 'w' or r[1] == 's' or r[1] == 'a') then
    if overlap == 'queue' then return {'held', cur} end
    skipped = skipped + n
    return save('overlap_skipped')
  end
end

if n == 0 then return save('fired') end

-- Only the jobs this call creates count against max_queue_length.
local fresh, new = 0, {}
for i = 0, n - 1 do
  local id = ARGV[10 + 4 * i]
  if not job_exists(ARGV[11 + 4 * i], id) then
    new[i] = true
    fresh = fresh + 1
  end
end
if limit > 0 and fresh > 0 then
  local adding = {}
  for i = 0, n - 1 do
    if new[i] then
      local q = ARGV[11 + 4 * i]
      adding[q] = (adding[q] or 0) + 1
    end
  end
  for q, extra in pairs(adding) do
    local c = redis.call('HMGET', k_counts(q), 'w', 's')
    if (tonumber(c[1]) or 0) + (tonumber(c[2]) or 0) + extra > limit then
      skipped = skipped + n
      return save('full')
    end
  end
end

-- Validated: from here on, only writes.
local orders = {}
for i = 0, n - 1 do
  if new[i] then
    local q = ARGV[11 + 4 * i]
    orders[q] = (orders[q] or 0) + 1
  end
end
for q, extra in pairs(orders) do orders[q] = redis.call('INCRBY', k_seq(q), extra) - extra end
for i = 0, n - 1 do
  local b = 10 + 4 * i
  if new[i] then
    local id, q, prio = ARGV[b], ARGV[b + 1], ARGV[b + 2]
    local order = orders[q] + 1
    orders[q] = order
    push_entry(q, prio, id, order, now, ARGV[b + 3])
    count(q, 'w', 1)
    work_queues[q] = true
  end
end
fired = fired + n
fired_at = string.format('%d', now)
last_job = ARGV[10 + 4 * (n - 1)]
flush_counts()
publish()
return save('fired')
