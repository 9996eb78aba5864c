#!lua flags=allow-oom
-- Extend leases, fenced by token. Status per lease: 0 OK, 1 LOST, 2 CANCEL_REQUESTED.
-- KEYS[1] = active
-- ARGV: P, lease_us, n, then n x (id, token)
local lease, n = tonumber(ARGV[2]), tonumber(ARGV[3])
if not lease or lease <= 0 or not is_int(n) or n < 0 or #ARGV ~= 3 + 2 * n then
  return bad_args('renew')
end
local deadline = now_us() + lease
local out = {}
for i = 0, n - 1 do
  local id, tok = ARGV[4 + 2 * i], ARGV[5 + 2 * i]
  local r = read_hash(id, 's', 't', 'cr')
  if r and r[1] == 'a' and r[2] == tok then
    redis.call('ZADD', KEYS[1], 'XX', deadline, id)
    if r[3] then out[i + 1] = 2 else out[i + 1] = 0 end
  else
    out[i + 1] = 1
  end
end
return out
