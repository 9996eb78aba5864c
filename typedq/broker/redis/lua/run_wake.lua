#!lua flags=allow-oom
-- Enqueue a turn of durable runs of one queue: now, or at a time (common/runs.lua's
-- run_ops.wake: at most one immediate turn waits at a time).
-- KEYS[1] = the queue's order counter
-- ARGV: P, queue, completed ttl (µs), completed max, failed ttl, failed max, then per
--   run: id, when (µs; 0 now)
-- Returns {per run 1 (woken) or 0 (no such run, or it has ended), ids retention dropped}.
local q = ARGV[2]
if #ARGV < 6 or (#ARGV - 6) % 2 ~= 0 or q == '' then return bad_args('run_wake') end
run_ops.bounds(ARGV[3], ARGV[4], ARGV[5], ARGV[6])
local now = now_us()
local out = {}
for i = 7, #ARGV, 2 do
  local r, at = ARGV[i], tonumber(ARGV[i + 1])
  if not at then return bad_args('run_wake') end
  if run_ops.state(q, r, now) == 'r' then
    run_ops.wake(q, r, at, now)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return run_ops.answer(out)
