#!lua flags=allow-oom
-- Cancel durable runs of one queue: a running run ends in state cancelled (its
-- failure record: reason cancelled, RUN_CANCELLED) and answers the jobs it waited on,
-- which the caller cancels (they may be on other slots).
-- KEYS[1] = the queue's order counter
-- ARGV: P, queue, completed ttl (µs), completed max, failed ttl, failed max, run ids...
-- Returns {per run false (no such run, or it had ended) or {waited job ids...}, ids
-- retention dropped}.
local q = ARGV[2]
if #ARGV < 6 or q == '' then return bad_args('run_cancel') end
run_ops.bounds(ARGV[3], ARGV[4], ARGV[5], ARGV[6])
local now = now_us()
local out = {}
for i = 7, #ARGV do
  local r = ARGV[i]
  if run_ops.state(q, r, now) == 'r' then
    local waited = {}
    for id in string.gmatch(rcall('HGET', k_run(q, 'u:', r), 'wj') or '', '%S+') do
      waited[#waited + 1] = id
    end
    run_ops.finish(q, r, 'x', nil,
      failure_record(CANCELLED_REASON, CANCELLED_TYPE, RUN_CANCELLED, 0, nil, now), now)
    out[#out + 1] = waited
  else
    out[#out + 1] = false
  end
end
return run_ops.answer(out)
