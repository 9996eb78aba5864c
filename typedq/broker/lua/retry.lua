#!lua flags=allow-oom
-- Put failed or cancelled jobs back to waiting (tail of their level, fresh attempt
-- and stall counts; finish time, result, error, progress cleared).
-- KEYS[1] = the queue's order counter
-- ARGV: P, queue, ids...
-- Returns per id: 'retried', 'not_retryable', 'in_flow' (a workflow's job that cannot
-- run again alone, see flow_retry) or 'not_found'. A workflow's step resumes its flow.
if #ARGV < 2 or ARGV[2] == '' then return bad_args('retry') end
local q = ARGV[2]
local out = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local r = read_job(q, id, 's', 'q', 'p')
  if not r then
    out[i - 2] = 'not_found'
  elseif r[1] ~= 'f' and r[1] ~= 'x' then
    out[i - 2] = 'not_retryable'
  elseif flow_retry(q, id) then
    out[i - 2] = 'in_flow'  -- see flow_retry (common.lua): a flow's job retried alone
  else
    local jk = k_job(q, id)
    redis.call('ZREM', k_done(q, r[1]), id)
    redis.call('HDEL', jk, 'a', 'k', 'st', 'fa', 'res', 'err', 'pg', 'cr', 'w', 't', 'd', 'r')
    redis.call('HSET', jk, 's', 'w', 'o', redis.call('INCR', k_seq(q)))
    push_waiting(q, sane_prio(r[3]), id, false)
    count(q, r[1], -1)
    count(q, 'w', 1)
    work_queues[q] = true
    out[i - 2] = 'retried'
  end
end
flush_counts()
publish()
return out
