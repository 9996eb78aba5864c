#!lua flags=allow-oom
-- Put failed or cancelled jobs back to waiting (tail of their level, fresh attempt
-- and stall counts; finish time, result, error, progress cleared).
-- KEYS[1] = seq, KEYS[2] = done:f, KEYS[3] = done:x
-- ARGV: P, ids...
-- Returns per id: 'retried', 'not_retryable' or 'not_found'.
if #ARGV < 1 then return bad_args('retry') end
local out = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  local r = read_job(id, 's', 'q', 'p')
  if not r then
    out[i - 1] = 'not_found'
  elseif r[1] ~= 'f' and r[1] ~= 'x' then
    out[i - 1] = 'not_retryable'
  else
    local jk, q = k_job(id), r[2] or ''
    if r[1] == 'f' then redis.call('ZREM', KEYS[2], id) else redis.call('ZREM', KEYS[3], id) end
    redis.call('HDEL', jk, 'a', 'k', 'st', 'fa', 'res', 'err', 'pg', 'cr', 'w', 't', 'd', 'r')
    redis.call('HSET', jk, 's', 'w', 'o', redis.call('INCR', KEYS[1]))
    push_waiting(q, sane_prio(r[3]), id, false)
    count(q, r[1], -1)
    count(q, 'w', 1)
    work_queues[q] = true
    out[i - 1] = 'retried'
  end
end
flush_counts()
publish()
return out
