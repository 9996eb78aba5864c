#!lua flags=allow-oom
-- Extend leases, fenced by token. Status per lease: 0 OK, 1 LOST, 2 CANCEL_REQUESTED.
-- KEYS[1] = the queue's active zset
-- ARGV: P, queue, lease_us, n, then n x (id, token)
local q, lease, n = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
if q == '' or not lease or lease <= 0 or not is_int(n) or n < 0 or #ARGV ~= 4 + 2 * n then
  return bad_args('renew')
end
local deadline = now_us() + lease
local out = {}
for i = 0, n - 1 do
  local id, tok = ARGV[5 + 2 * i], ARGV[6 + 2 * i]
  local r = read_hash(q, id, 's', 't', 'cr')
  if r and r[1] == 'a' and r[2] == tok then
    redis.call('ZADD', k_active(q), 'XX', deadline, id)
    if r[3] then out[i + 1] = 2 else out[i + 1] = 0 end
  else
    out[i + 1] = 1
  end
end
return out
