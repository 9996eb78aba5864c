#!lua
-- Index and create durable runs of one queue in one call (one Redis only: the app's
-- index P runs is on another slot on Redis Cluster, where run_index.lua then
-- run_create.lua do this). Per run: indexed on this queue unless an id is indexed
-- already; a run indexed on this queue is created as run_create.lua does; one indexed on
-- another queue (a run created before under that id stays where it is) is left alone.
-- Refused at maxmemory (no allow-oom flag), as enqueues are.
-- KEYS[1] = the queue's order counter, KEYS[2] = P runs
-- ARGV: P, queue, completed ttl (µs), completed max, failed ttl, failed max, then per
--   run: id, spec (msgpack RunSpec), the body of its turn jobs
-- Returns {per run {created 0/1, the run (run_ops.reply)} or {2, the queue it is
-- indexed on}, ids retention dropped}.
local q = ARGV[2]
if #ARGV < 6 or (#ARGV - 6) % 3 ~= 0 or q == '' then return bad_args('run_start') end
run_ops.bounds(ARGV[3], ARGV[4], ARGV[5], ARGV[6])
local now = now_us()
local out = {}
for i = 7, #ARGV, 3 do
  local r = ARGV[i]
  rcall('HSETNX', KEYS[2], r, q)
  local where = rcall('HGET', KEYS[2], r)
  if where == q then
    out[#out + 1] = run_ops.create(q, r, ARGV[i + 1], ARGV[i + 2], now)
  else
    out[#out + 1] = {2, where}
  end
end
return run_ops.answer(out)
