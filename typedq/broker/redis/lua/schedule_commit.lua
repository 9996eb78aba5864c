#!lua
-- Redis Cluster's app-wide half of firing a schedule's ticks (schedule_fire.lua does it
-- all in one script on standalone Redis, where the schedules hash and the jobs share a
-- server). On a cluster the jobs live in their queue's slot, the app-wide states in the
-- app's: the client checks here ('check'), fires in the queue's slot (schedule_fire.lua
-- on the schedule's firing state there: check, overlap, enqueue and move in one script,
-- so a scheduler that stalls anywhere never stores a tick twice), then moves the
-- app-wide state up to the firing state it got ('up': only forward, never back).
-- Without a queue (a firing of no jobs, from a caller that names none) the state moves
-- here, compare and set ('fired', 'overlap_skipped' or 'full').
-- KEYS[1] = schedules hash
-- ARGV: P, name, digest, expected_last, new_last, skipped, mode, n, last_job (mode 'up':
--   the state to move up to)
--   mode 'check' (no writes), 'fired' (n jobs stored), 'overlap_skipped' or 'full'
--   (n ticks skipped), 'up'
-- Returns {outcome or 'ok' (check), state or false}: 'stale' when the state moved on.
if ARGV[7] == 'up' then
  local cur = rcall('HGET', KEYS[1], ARGV[2])
  local want = string.sub(ARGV[9], 1, #ARGV[3] + 1) == ARGV[3] .. '|'
    and string.match(ARGV[9], '^[^|]*|(%-?%d+)|%d+|%d+|%d+|')
  if not want then return bad_args('schedule_commit') end
  local d, l = string.match(cur or '', '^([^|]*)|(%-?%d+)|')
  if not d then return {'stale', false} end
  if d == ARGV[3] and tonumber(l) < tonumber(want) then
    rcall('HSET', KEYS[1], ARGV[2], ARGV[9])
    return {'up', ARGV[9]}
  end
  return {'up', cur}
end
if #ARGV ~= 9 or ARGV[2] == '' or not is_int(ARGV[4]) or not is_int(ARGV[5])
    or not is_int(ARGV[6]) or not is_int(ARGV[8]) then
  return bad_args('schedule_commit')
end
local name, digest, mode, n = ARGV[2], ARGV[3], ARGV[7], tonumber(ARGV[8])
if mode ~= 'check' and mode ~= 'fired' and mode ~= 'overlap_skipped' and mode ~= 'full' then
  return bad_args('schedule_commit')
end
local st = schedule_state(KEYS[1], name, digest, ARGV[4], ARGV[5])
if st.stale then return st.stale end
local cur, fired_at, fired, last_job, now = st.cur, st.fired_at, st.fired, st.last_job, st.now
if mode == 'check' then return {'ok', cur} end
local skipped = st.skipped + tonumber(ARGV[6])
if mode == 'fired' then
  if n > 0 then
    fired = fired + n
    fired_at = string.format('%d', now)
    last_job = ARGV[9]
  end
else
  skipped = skipped + n
end
local state = digest .. '|' .. ARGV[5] .. '|' .. fired_at .. '|' .. string.format('%d', fired)
  .. '|' .. string.format('%d', skipped) .. '|' .. last_job
redis.call('HSET', KEYS[1], name, state)
return {mode, state}
