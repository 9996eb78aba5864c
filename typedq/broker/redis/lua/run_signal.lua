#!lua
-- Deliver signals to durable runs of one queue (typedq.broker.runs.RunSignal): kept in
-- the run's inbox of that signal, oldest first; a run waiting for it is woken.
-- Refused at maxmemory (no allow-oom flag), as enqueues are.
-- KEYS[1] = the queue's order counter
-- ARGV: P, queue, completed ttl (µs), completed max, failed ttl, failed max, then per
--   signal: run id, signal name, payload
-- Returns {per signal 'delivered' | 'finished' | 'not_found', ids retention dropped}.
local q = ARGV[2]
if #ARGV < 6 or (#ARGV - 6) % 3 ~= 0 or q == '' then return bad_args('run_signal') end
run_ops.bounds(ARGV[3], ARGV[4], ARGV[5], ARGV[6])
local now = now_us()
local out = {}
for i = 7, #ARGV, 3 do
  local r, s = ARGV[i], ARGV[i + 1]
  local st = run_ops.state(q, r, now)
  if not st then
    out[#out + 1] = 'not_found'
  elseif st ~= 'r' then
    out[#out + 1] = 'finished'
  else
    rcall('RPUSH', k_run(q, 'us:', r .. '|' .. s), ARGV[i + 2])
    rcall('SADD', k_run(q, 'uS:', r), s)
    if rcall('HGET', k_run(q, 'u:', r), 'ws') == s then run_ops.wake(q, r, 0, now) end
    out[#out + 1] = 'delivered'
  end
end
return run_ops.answer(out)
