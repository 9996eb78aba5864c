#!lua flags=no-writes
-- Throughput rollups of the last `minutes` minutes, per queue (the dashboard's chart).
-- KEYS: the counts hash of each queue (declared for routing; minute keys read by name)
-- ARGV: P, minutes, queue...
-- Returns the current minute (minutes since the epoch), then per queue a flat list of
-- completed, failed, retried per minute, oldest first.
local minutes = tonumber(ARGV[2])
if not is_int(minutes) or minutes < 1 or minutes > HISTORY_MINUTES then return bad_args('history') end
local now = math.floor(now_us() / 60000000)
local out = {now}
for i = 3, #ARGV do
  local q = ARGV[i]
  local row = {}
  for m = now - minutes + 1, now do
    local v = redis.call('HMGET', k_minute(q, string.format('%d', m)), 'c', 'f', 'r')
    row[#row + 1] = tonumber(v[1]) or 0
    row[#row + 1] = tonumber(v[2]) or 0
    row[#row + 1] = tonumber(v[3]) or 0
  end
  out[#out + 1] = row
end
return out
