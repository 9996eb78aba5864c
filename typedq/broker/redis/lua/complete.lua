#!lua flags=allow-oom
-- Finish jobs of one queue as completed, fenced by token. Outcome per item: 0 OK,
-- 1 ALREADY_FINISHED (same token, a re-sent request), 2 LEASE_LOST, 3 NOT_FOUND.
-- KEYS[1] = the queue's active zset (the slot this runs on)
-- ARGV: P, queue, completed_ttl_us, completed_max, n, then n x (id, token, result),
--       [fan-out members' spans: see read_span_links]
local q, ttl, cap, n = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
if q == '' or not ttl or not is_int(cap) or not is_int(n) or n < 0
    or (#ARGV ~= 5 + 3 * n and not read_span_links(ARGV, 6 + 3 * n)) then
  return bad_args('complete')
end
local now = now_us()
local out = {}
batch_zsets(n > 1)  -- one write per sorted set, not per job (common/bookkeeping.lua)
for i = 0, n - 1 do
  local b = 6 + 3 * i
  out[i + 1] = complete_one(q, ARGV[b], ARGV[b + 1], ARGV[b + 2], now)
end
trim(q, 'c', now, ttl, cap, n + 100)
flush_counts()
publish()
return flow_reply(out)
