#!lua
-- Store workflows (typedq/broker/flow.py), each atomically with all its jobs: the
-- fan-out members waiting, step 0 of a chain waiting, every other step held
-- (scheduled at HELD_US, its body split around the empty payload into mh/mt), and
-- the flow record f:<F> on the queue of the flow's own job F (the last step). A flow whose id exists stores nothing (0); one whose jobs
-- would pass max_queue_length stores nothing and answers its QueueFull text.
-- Refused at maxmemory (no allow-oom flag), like enqueue.
-- A re-sent call (same request record: lost reply, client retry) returns the first
-- copy's answer, so the flows it created still answer created = 1.
-- KEYS[1] = the order counter of the first flow's own job's queue, KEYS[2] = this
-- call's request record (on that slot). Every job of a flow holds fl (the flow id)
-- and fq (the queue of the flow's own job).
-- ARGV: P, max_queue_length, m, then m flows, each:
--   id, steps S, members n, fan_out ('0'/'1'), collector ('0'/'1'), policy ('a'/'c'),
--   n x (id, queue, priority, body), S x (id, queue, priority, body, head, tail)
-- Returns per flow: 1 created, 0 existed, or why it was refused:
-- 'TYPEDQ_QUEUE_FULL q pending extra limit' or 'TYPEDQ_FLOW_ID_TAKEN id'.
local limit, m = tonumber(ARGV[2]), tonumber(ARGV[3])
if not limit or not is_int(m) or m < 0 then return bad_args('flow_enqueue') end
local flows = {}
local b = 4
for _ = 1, m do
  local f = {id = ARGV[b], steps = tonumber(ARGV[b + 1]), n = tonumber(ARGV[b + 2]),
    fan_out = ARGV[b + 3] == '1', collector = ARGV[b + 4] == '1', pol = ARGV[b + 5]}
  if not f.id or f.id == '' or not is_int(f.steps) or f.steps < 1 or not is_int(f.n)
      or f.n < 0 then
    return bad_args('flow_enqueue')
  end
  f.at = b + 6
  b = f.at + 4 * f.n + 6 * f.steps
  if b - 1 > #ARGV then return bad_args('flow_enqueue') end
  for i = 0, f.n + f.steps - 1 do
    local at = f.at + 4 * math.min(i, f.n) + 6 * math.max(0, i - f.n)
    local q = ARGV[at + 1]
    if ARGV[at] == '' or not q or q == '' or string.find(q, '|', 1, true)
        or not is_int(ARGV[at + 2]) then
      return bad_args('flow_enqueue')
    end
  end
  flows[#flows + 1] = f
end
if b - 1 ~= #ARGV then return bad_args('flow_enqueue') end

local prev = redis.pcall('GET', KEYS[2])
if type(prev) == 'string' and #prev == m then
  local again = {}
  for i = 1, m do again[i] = string.byte(prev, i) - 48 end
  return again
end

local now = now_us()
local added = {}
local out = {}

local function store(id, q, prio, body, fields)
  local t = {'m', body, 'q', q, 'o', redis.call('INCR', k_seq(q)), 'e', now}
  if prio ~= '0' then t[#t + 1] = 'p'; t[#t + 1] = prio end
  for _, v in ipairs(fields) do t[#t + 1] = v end
  redis.call('HSET', k_job(q, id), unpack(t))
end

for fi, f in ipairs(flows) do
  local fq = ARGV[f.at + 4 * f.n + 6 * (f.steps - 1) + 1]
  if redis.call('EXISTS', k_job(fq, f.id)) == 1 then
    out[fi] = 0
  else
    local adding, refused = {}, nil
    for i = 0, f.n + f.steps - 1 do
      local at = f.at + 4 * math.min(i, f.n) + 6 * math.max(0, i - f.n)
      local q = ARGV[at + 1]
      adding[q] = (adding[q] or 0) + 1
    end
    -- A derived id (F.m<i>, F.<k>) taken by another job: refused, nothing stored.
    for i = 0, f.n + f.steps - 2 do
      local at = f.at + 4 * math.min(i, f.n) + 6 * math.max(0, i - f.n)
      if not refused and redis.call('EXISTS', k_job(ARGV[at + 1], ARGV[at])) == 1 then
        refused = 'TYPEDQ_FLOW_ID_TAKEN ' .. ARGV[at]
      end
    end
    if limit > 0 and not refused then
      for q, extra in pairs(adding) do
        local c = redis.call('HMGET', k_counts(q), 'w', 's')
        local pending = (tonumber(c[1]) or 0) + (tonumber(c[2]) or 0) + (added[q] or 0)
        if pending + extra > limit then
          refused = string.format('TYPEDQ_QUEUE_FULL %s %d %d %d', q, pending, extra, limit)
          break
        end
      end
    end
    if refused then
      out[fi] = refused
    else
      for q, extra in pairs(adding) do added[q] = (added[q] or 0) + extra end
      local fid = f.id
      local mq, sq = {}, {}
      for i = 0, f.n - 1 do
        local at = f.at + 4 * i
        local id, q, prio = ARGV[at], ARGV[at + 1], ARGV[at + 2]
        mq[#mq + 1] = q
        store(id, q, prio, ARGV[at + 3], {'s', 'w', 'fl', fid, 'fq', fq, 'fm', i})
        push_waiting(q, prio, id, false)
        count(q, 'w', 1)
        work_queues[q] = true
      end
      for k = 0, f.steps - 1 do
        local at = f.at + 4 * f.n + 6 * k
        local id, q, prio = ARGV[at], ARGV[at + 1], ARGV[at + 2]
        sq[#sq + 1] = q
        -- The flow's own job keeps the flow's shape (for inspect, after the record ends).
        local shape = {}
        if k == f.steps - 1 then shape = {'fS', f.steps, 'fn', f.n} end
        if k == 0 and not f.fan_out then
          store(id, q, prio, ARGV[at + 3], {'s', 'w', 'fl', fid, 'fq', fq, 'fs', k, unpack(shape)})
          push_waiting(q, prio, id, false)
          count(q, 'w', 1)
          work_queues[q] = true
        else
          store(id, q, prio, ARGV[at + 3], {'s', 's', 'r', HELD_US, 'fl', fid, 'fq', fq, 'fs', k,
            'mh', ARGV[at + 4], 'mt', ARGV[at + 5], unpack(shape)})
          redis.call('ZADD', k_sched(q), HELD_US, id)
          count(q, 's', 1)
        end
      end
      local pol = 'a'
      if f.pol == 'c' then pol = 'c' end
      local col = '0'
      if f.collector then col = '1' end
      redis.call('HSET', k_flow(fq, fid), 'S', f.steps, 'n', f.n, 'c', f.n, 'col', col,
        'pol', pol, 'mq', flow_queue_list(mq), 'sq', flow_queue_list(sq))
      if f.fan_out and f.n == 0 then flow_fan_in(fq, fid, f.steps, 0, f.collector, now) end
      out[fi] = 1
    end
  end
end
-- Remembered only when every flow got a 0/1 answer (a refused one stored nothing, and
-- a re-sent copy decides it again).
local digits = {}
for i = 1, m do
  if type(out[i]) == 'number' then digits[i] = tostring(out[i]) end
end
if #digits == m and m > 0 then redis.call('SET', KEYS[2], table.concat(digits), 'PX', REQ_TTL_MS) end
flush_counts()
publish()
return out
