#!lua flags=allow-oom
-- Read durable runs of one queue (common/runs.lua); an ended run past its age bound is
-- deleted and reads as none.
-- KEYS[1] = the queue's order counter
-- ARGV: P, queue, completed ttl (µs), completed max, failed ttl, failed max, run ids...
-- Returns {per run its reply (run_ops.reply, then the time of the read in µs) or false,
-- ids retention dropped}.
local q = ARGV[2]
if #ARGV < 6 or q == '' then return bad_args('run_get') end
run_ops.bounds(ARGV[3], ARGV[4], ARGV[5], ARGV[6])
local now = now_us()
local out = {}
for i = 7, #ARGV do
  local r = ARGV[i]
  local reply = run_ops.state(q, r, now) and run_ops.reply(q, r) or false
  if reply then reply[#reply + 1] = now end  -- the read's time: a turn replays at it
  out[#out + 1] = reply
end
return run_ops.answer(out)
