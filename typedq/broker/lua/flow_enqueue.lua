#!lua
-- Store workflows (typedq/broker/flow.py), each atomically with all its jobs: the
-- fan-out members waiting, step 0 of a chain waiting, every other step held
-- (scheduled at HELD_US, its body split around the empty payload into mh/mt), and
-- the flow record f:<F> on the queue of the flow's own job F (the last step). A flow
-- whose id exists stores nothing (0); one whose jobs would pass max_queue_length
-- stores nothing and answers its QueueFull text.
-- Refused at maxmemory (no allow-oom flag), like enqueue.
-- A re-sent call (same request record: lost reply, client retry) returns the first
-- copy's answer, so the flows it created still answer created = 1.
-- KEYS[1] = the order counter of the first flow's own job's queue, KEYS[2] = this
-- call's request record (on that slot). Every job of a flow holds fl (the flow id)
-- and fq (the queue of the flow's own job).
-- ARGV: P, max_queue_length, m, then m flows, each:
--   id, steps S, members n, fan_out ('0'/'1'), collector ('0'/'1'), policy ('a'/'c'),
--   the members' queue and priority (one task: all alike; '' when n = 0),
--   n x body (member i's id is <id>.m<i>), S x (id, queue, priority, body, head, tail)
-- Returns per flow: 1 created, 0 existed, or why it was refused:
-- 'TYPEDQ_QUEUE_FULL q pending extra limit' or 'TYPEDQ_FLOW_ID_TAKEN id'.
--
-- Cost: a member is one argument and one HSET; everything else of a flow is O(1)
-- commands (one INCRBY per queue for the order numbers, one EXISTS per 1000 derived
-- ids, one LPUSH per 1000 waiting ids), so a large fan-out is one short script.
local limit, m = tonumber(ARGV[2]), tonumber(ARGV[3])
if not limit or not is_int(m) or m < 0 then return bad_args('flow_enqueue') end
local function bad_queue(q) return not q or q == '' or string.find(q, '|', 1, true) end
local flows = {}
local b = 4
for _ = 1, m do
  local f = {id = ARGV[b], steps = tonumber(ARGV[b + 1]), n = tonumber(ARGV[b + 2]),
    fan_out = ARGV[b + 3] == '1', collector = ARGV[b + 4] == '1', pol = ARGV[b + 5],
    mq = ARGV[b + 6], mprio = ARGV[b + 7]}
  if not f.id or f.id == '' or not is_int(f.steps) or f.steps < 1 or not is_int(f.n)
      or f.n < 0 or (f.n > 0 and (bad_queue(f.mq) or not is_int(f.mprio))) then
    return bad_args('flow_enqueue')
  end
  f.at = b + 8             -- the first member's body
  f.st = f.at + f.n        -- the first step's id
  b = f.st + 6 * f.steps
  if b - 1 > #ARGV then return bad_args('flow_enqueue') end
  for k = 0, f.steps - 1 do
    local at = f.st + 6 * k
    if ARGV[at] == '' or bad_queue(ARGV[at + 1]) or not is_int(ARGV[at + 2]) then
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
local CHUNK = 1000  -- ids per LPUSH / keys per EXISTS (well below Lua's unpack limit)

-- Is any derived id of the flow (its members' F.m<i>, its steps' F.<k>; not F itself)
-- taken by another job? One EXISTS per CHUNK keys; the first taken id only when one is.
local function first_taken(f)
  local ids = {}
  for k = 0, f.steps - 2 do
    local at = f.st + 6 * k
    ids[#ids + 1] = {ARGV[at + 1], ARGV[at]}
  end
  for s = 0, f.n - 1, CHUNK do
    local keys = {}
    local last = math.min(s + CHUNK, f.n) - 1
    local mp = k_job(f.mq, f.id .. '.m')
    for i = s, last do keys[#keys + 1] = mp .. i end
    if redis.call('EXISTS', unpack(keys)) > 0 then
      for i = s, last do
        if redis.call('EXISTS', keys[i - s + 1]) == 1 then return f.id .. '.m' .. i end
      end
    end
    -- A waiting entry has no key: its id is in the queue's index (see keys.py).
    for i = s, last do
      local id = f.id .. '.m' .. i
      if redis.call('HEXISTS', k_idx(f.mq, id), id) == 1 then return id end
    end
  end
  for _, j in ipairs(ids) do
    if job_exists(j[1], j[2]) then return j[2] end
  end
  return nil
end

for fi, f in ipairs(flows) do
  local fq = ARGV[f.st + 6 * (f.steps - 1) + 1]
  if job_exists(fq, f.id) then
    out[fi] = 0
  else
    local adding, refused = {}, nil
    if f.n > 0 then adding[f.mq] = f.n end
    local sq = {}
    for k = 0, f.steps - 1 do
      local q = ARGV[f.st + 6 * k + 1]
      sq[#sq + 1] = q
      adding[q] = (adding[q] or 0) + 1
    end
    -- A derived id (F.m<i>, F.<k>) taken by another job: refused, nothing stored.
    local taken = first_taken(f)
    if taken then refused = 'TYPEDQ_FLOW_ID_TAKEN ' .. taken end
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
      -- This flow's order numbers on each queue: one INCRBY reserves them all, handed
      -- out in the order the jobs are stored (members, then steps), as one INCR each would.
      local order = {}
      for q, extra in pairs(adding) do
        added[q] = (added[q] or 0) + extra
        order[q] = redis.call('INCRBY', k_seq(q), extra) - extra
      end
      local fid = f.id
      if f.n > 0 then
        local q, prio = f.mq, f.mprio
        local mp = k_job(q, fid .. '.m')
        local o = order[q]
        local ids = {}
        for i = 0, f.n - 1 do
          o = o + 1
          if prio ~= '0' then
            redis.call('HSET', mp .. i, 'm', ARGV[f.at + i], 'q', q, 'o', o, 'e', now, 'p', prio,
              's', 'w', 'fl', fid, 'fq', fq, 'fm', i)
          else
            redis.call('HSET', mp .. i, 'm', ARGV[f.at + i], 'q', q, 'o', o, 'e', now,
              's', 'w', 'fl', fid, 'fq', fq, 'fm', i)
          end
          ids[#ids + 1] = fid .. '.m' .. i
          if #ids == CHUNK or i == f.n - 1 then
            redis.call('LPUSH', k_wait(q, prio), unpack(ids))
            ids = {}
          end
        end
        order[q] = o
        redis.call('ZADD', k_levels(q), -tonumber(prio), prio)
        count(q, 'w', f.n)
        work_queues[q] = true
      end
      for k = 0, f.steps - 1 do
        local at = f.st + 6 * k
        local id, q, prio = ARGV[at], ARGV[at + 1], ARGV[at + 2]
        order[q] = order[q] + 1
        local t = {'m', ARGV[at + 3], 'q', q, 'o', order[q], 'e', now, 'fl', fid, 'fq', fq,
          'fs', k}
        if prio ~= '0' then t[#t + 1] = 'p'; t[#t + 1] = prio end
        -- The flow's own job keeps the flow's shape (for inspect, after the record ends,
        -- and for a retry that resumes the flow: the steps' queues).
        if k == f.steps - 1 then
          for _, v in ipairs({'fS', f.steps, 'fn', f.n, 'fsq', flow_queue_list(sq)}) do
            t[#t + 1] = v
          end
        end
        if k == 0 and not f.fan_out then
          t[#t + 1] = 's'; t[#t + 1] = 'w'
          redis.call('HSET', k_job(q, id), unpack(t))
          push_waiting(q, prio, id, false)
          count(q, 'w', 1)
          work_queues[q] = true
        else
          for _, v in ipairs({'s', 's', 'r', HELD_US, 'mh', ARGV[at + 4], 'mt', ARGV[at + 5]}) do
            t[#t + 1] = v
          end
          redis.call('HSET', k_job(q, id), unpack(t))
          redis.call('ZADD', k_sched(q), HELD_US, id)
          count(q, 's', 1)
        end
      end
      local pol = 'a'
      if f.pol == 'c' then pol = 'c' end
      local col = '0'
      if f.collector then col = '1' end
      redis.call('HSET', k_flow(fq, fid), 'S', f.steps, 'n', f.n, 'c', f.n, 'col', col,
        'pol', pol, 'mq', f.n > 0 and f.mq or '', 'sq', flow_queue_list(sq))
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
