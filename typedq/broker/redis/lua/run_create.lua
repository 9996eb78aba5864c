#!lua
-- Create durable runs on one queue (common/runs.lua): a run not there yet is stored
-- running and its first turn is enqueued; an existing one is left as it is.
-- Refused at maxmemory (no allow-oom flag), as enqueues are.
-- KEYS[1] = the queue's order counter
-- ARGV: P, queue, completed ttl (µs), completed max, failed ttl, failed max, then per
--   run: id, spec (msgpack RunSpec), the body of its turn jobs
-- Returns {per run {created 0/1, the run (run_ops.reply)}, ids retention dropped}.
local q = ARGV[2]
if #ARGV < 6 or (#ARGV - 6) % 3 ~= 0 or q == '' then return bad_args('run_create') end
run_ops.bounds(ARGV[3], ARGV[4], ARGV[5], ARGV[6])
local now = now_us()
local out = {}
for i = 7, #ARGV, 3 do
  out[#out + 1] = run_ops.create(q, ARGV[i], ARGV[i + 1], ARGV[i + 2], now)
end
return run_ops.answer(out)
