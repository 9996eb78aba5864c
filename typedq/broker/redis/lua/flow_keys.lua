#!lua flags=no-writes
-- One page of a queue's flow-control keys (typedq inspect, the dashboard; capability
-- FlowViews): one SCAN (unique, debounce markers) or HSCAN (the fair lanes' hash) step of
-- COUNT `count` from `cursor`, so a call costs in proportion to the count, never to the
-- keyspace (a step may find none: the caller follows the cursor). SCAN walks the keys of
-- the node serving the queue's slot, matching the queue's own prefix only.
-- KEYS[1] = the queue's active zset (routes the call to the queue's slot)
-- ARGV: P, queue, kind ('u' unique, 'd' debounce, 'f' fair, 's' job streams), cursor,
--   count, MATCH pattern (the queue prefix escaped for glob, then 'uk:*', 'db:*', 'js:*')
-- Returns {next cursor ('0' at the end), now (µs), then per key:
--   u: marker ('<task>|<key>'), holder id, ms left of the window (-1: no TTL, the job
--      has not finished);
--   d: marker, collecting id, run time (µs; -1: not scheduled now);
--   f: lane ('<prio>|<task>|<key>'), jobs in the lane, the key's weight (-1: unknown):
--      the weight of its next turn, its newest job's (the F hash: common/lanes.lua
--      lane_push);
--   s: job id, entries in its stream (XLEN), readers counted now (ZCOUNT of its
--      readers' set Q jr:<id> past now: stream_reader.lua)}
local q, kind, cur, count, pattern = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6]
if #ARGV ~= 6 or q == '' or not is_int(count) or count < 1 or count > 10000
    or not string.match(cur, '^%d+$') then
  return bad_args('flow_keys')
end
local qp = k_q(q)
local out = {'0', now_us()}
if kind == 'f' then
  local r = rcall('HSCAN', k_lanes(q), cur, 'COUNT', count)
  out[1] = r[1]
  local found = r[2]
  for i = 1, #found - 1, 2 do
    local lane = found[i]
    local prio, marker = string.match(lane, '^([^|]*)|(.*)$')
    if prio then
      out[#out + 1] = lane
      out[#out + 1] = rcall('LLEN', qp .. 'fk:' .. marker .. ':' .. prio)
      out[#out + 1] = tonumber(found[i + 1]) or -1
    end
  end
  return out
end
if kind ~= 'u' and kind ~= 'd' and kind ~= 's' then return bad_args('flow_keys') end
local r = rcall('SCAN', cur, 'MATCH', pattern, 'COUNT', count)
out[1] = r[1]
local skip = #qp + 3
if kind == 's' then
  local live = '(' .. math.floor(out[2] / 1000)
  for _, name in ipairs(r[2]) do
    local id = string.sub(name, skip + 1)
    out[#out + 1] = id
    out[#out + 1] = rcall('XLEN', name)
    out[#out + 1] = rcall('ZCOUNT', qp .. 'jr:' .. id, live, '+inf')
  end
  return out
end
for _, name in ipairs(r[2]) do
  local id = rcall('GET', name)
  if id then
    local marker = string.sub(name, skip + 1)
    if kind == 'u' then
      local left = rcall('PTTL', name)
      -- A marker without a TTL whose job is gone (removed, purged) is stale: not held.
      if left ~= -1 or job_exists(q, id) then
        out[#out + 1] = marker
        out[#out + 1] = id
        out[#out + 1] = left
      end
    else
      local at = rcall('ZSCORE', k_sched(q), id)
      out[#out + 1] = marker
      out[#out + 1] = id
      out[#out + 1] = at or '-1'
    end
  end
end
return out
