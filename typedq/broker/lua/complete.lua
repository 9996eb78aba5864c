#!lua flags=allow-oom
-- Finish jobs as completed, fenced by token. Outcome per item: 0 OK,
-- 1 ALREADY_FINISHED (same token, a re-sent request), 2 LEASE_LOST, 3 NOT_FOUND.
-- KEYS[1] = active, KEYS[2] = done:c
-- ARGV: P, completed_ttl_us, completed_max, n, then n x (id, token, result)
local ttl, cap, n = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if not ttl or not is_int(cap) or not is_int(n) or n < 0 or #ARGV ~= 4 + 3 * n then
  return bad_args('complete')
end
local now = now_us()
local out = {}
for i = 0, n - 1 do
  local b = 5 + 3 * i
  local id, tok = ARGV[b], ARGV[b + 1]
  local r = read_hash(id, 's', 't', 'd', 'q', 'ck', 'fl', 'fm', 'fs')
  if not r then
    out[i + 1] = not_active_answer(id)
  elseif r[1] == 'a' and r[2] == tok then
    flow_link_of(id, r[6], r[7], r[8])
    redis.call('HSET', k_job(id), 'res', ARGV[b + 2], 'd', tok)
    redis.call('ZREM', KEYS[1], id)
    free_slot(id, r[4] or '', r[5])
    finalize(id, r[4] or '', 'a', 'c', KEYS[2], now)
    out[i + 1] = 0
  elseif r[3] == tok then
    out[i + 1] = 1
  else
    out[i + 1] = 2
  end
end
trim('c', KEYS[2], now, ttl, cap, n + 100)
flush_counts()
publish()
return out
