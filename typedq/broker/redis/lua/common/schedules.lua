-- common/schedules.lua: A schedule's state, read by the firing scripts.
-- (A part of the shared prelude, in the order of scripts.py's PARTS: README.md.)
-- A schedule's state (typedq.schedule; one field of the schedules hash:
-- 'digest|last|fired_at|fired|skipped|last_job'), read for a firing that moves it from
-- tick `last` to tick `tick`. Its `stale` is the answer to return when the state is gone,
-- garbled, changed since (`digest`, `last`) or `tick` is later than the Redis clock.
local function schedule_state(key, name, digest, last, tick)
  local cur = rcall('HGET', key, name)
  if not cur then return {stale = {'stale', false}} end
  local d, l, fired_at, fired, skipped, last_job =
    string.match(cur, '^([^|]*)|(%-?%d+)|(%d+)|(%d+)|(%d+)|(.*)$')
  if not d then return {stale = {'stale', false}} end
  local now = now_us()
  if d ~= digest or l ~= last or tonumber(tick) <= tonumber(l) or tonumber(tick) > now then
    return {stale = {'stale', cur}}
  end
  return {cur = cur, fired_at = fired_at, fired = tonumber(fired), skipped = tonumber(skipped),
    last_job = last_job, now = now}
end
