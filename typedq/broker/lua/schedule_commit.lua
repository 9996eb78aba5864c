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
local cur = redis.call('HGET', KEYS[1], name)
if not cur then return {'stale', false} end
local d, last, fired_at, fired, skipped, last_job =
  string.match(cur, '^([^|]*)|(%-?%d+)|(%d+)|(%d+)|(%d+)|(.*)$')
if not d then return {'stale', false} end
local now = now_us()
if d ~= digest or last ~= ARGV[4] or tonumber(ARGV[5]) <= tonumber(last)
    or tonumber(ARGV[5]) > now then
  return {'stale', cur}
end
if mode == 'check' then return {'ok', cur} end
fired, skipped = tonumber(fired), tonumber(skipped) + tonumber(ARGV[6])
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
