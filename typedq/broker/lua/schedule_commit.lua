#!lua
-- Redis Cluster's half of firing a schedule's ticks (schedule_fire.lua does it all in one
-- script on standalone Redis, where the schedules hash and the jobs share a server). On a
-- cluster the jobs live in their queue's slot, the states in the app's: the client checks
-- here ('check'), enqueues the ticks' jobs in their queue (ids derived from the schedule
-- and tick: a second scheduler's copies are the same jobs), then moves the state here,
-- compare and set on the digest and last tick it read: only one scheduler's move wins.
-- KEYS[1] = schedules hash
-- ARGV: P, name, digest, expected_last, new_last, skipped, mode, n, last_job
--   mode 'check' (no writes), 'fired' (n jobs stored), 'overlap_skipped' or 'full'
--   (n ticks skipped)
-- Returns {outcome or 'ok' (check), state or false}: 'stale' when the state moved on.
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
