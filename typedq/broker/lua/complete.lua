#!lua flags=allow-oom
-- Finish jobs of one queue as completed, fenced by token. Outcome per item: 0 OK,
-- 1 ALREADY_FINISHED (same token, a re-sent request), 2 LEASE_LOST, 3 NOT_FOUND.
-- KEYS[1] = the queue's active zset (the slot this runs on)
-- ARGV: P, queue, completed_ttl_us, completed_max, n, then n x (id, token, result)
local q, ttl, cap, n = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
if q == '' or not ttl or not is_int(cap) or not is_int(n) or n < 0 or #ARGV ~= 5 + 3 * n then
  return bad_args('complete')
end
local now = now_us()
local out = {}
local active = k_active(q)
for i = 0, n - 1 do
  local b = 6 + 3 * i
  local id, tok = ARGV[b], ARGV[b + 1]
  local r = read_hash(q, id, 's', 't', 'd', 'ck', 'fl', 'fm', 'fs', 'fq')
  if not r then
    out[i + 1] = not_active_answer(q, id)
  elseif r[1] == 'a' and r[2] == tok then
    flow_link_of(q, id, r[5], r[6], r[7], r[8])
    redis.call('HSET', k_job(q, id), 'res', ARGV[b + 2], 'd', tok)
    redis.call('ZREM', active, id)
    free_slot(id, q, r[4])
    finalize(id, q, 'a', 'c', now)
    out[i + 1] = 0
  elseif r[3] == tok then
    out[i + 1] = 1
  else
    out[i + 1] = 2
  end
end
trim(q, 'c', now, ttl, cap, n + 100)
flush_counts()
publish()
return out
