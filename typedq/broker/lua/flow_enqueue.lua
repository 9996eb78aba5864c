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

-- Batched writes (a fan-out of n members costs O(1) commands beyond its n HSETs): each
-- flow reserves its jobs' order numbers with one INCRBY per queue and pushes its
-- waiting jobs with one LPUSH per level list (in the same order as one push per job).
local CHUNK = 1000  -- ids per LPUSH / keys per EXISTS (well below Lua's unpack limit)
local orders = {}
local function next_order(q)
  local o = orders[q]
  o.next = o.next + 1
  return o.next
end
local pushes, push_order = {}, {}
local function push_later(q, prio, id)
  local lk = k_wait(q, prio)
  local p = pushes[lk]
  if not p then
    p = {q = q, prio = prio, ids = {}}
    pushes[lk] = p
    push_order[#push_order + 1] = lk
  end
  p.ids[#p.ids + 1] = id
end
local function flush_pushes()
  for _, lk in ipairs(push_order) do
    local p = pushes[lk]
    for s = 1, #p.ids, CHUNK do
      redis.call('LPUSH', lk, unpack(p.ids, s, math.min(s + CHUNK - 1, #p.ids)))
    end
    redis.call('ZADD', k_levels(p.q), -tonumber(p.prio), p.prio)
  end
  pushes, push_order = {}, {}
end

local function store(id, q, prio, body, fields)
  local t = {'m', body, 'q', q, 'o', next_order(q), 'e', now}
  if prio ~= '0' then t[#t + 1] = 'p'; t[#t + 1] = prio end
  for _, v in ipairs(fields) do t[#t + 1] = v end
  redis.call('HSET', k_job(q, id), unpack(t))
end

-- Is any of the flow's derived ids (F.m<i>, F.<k>, the last step's F excluded) taken by
-- another job? One EXISTS per CHUNK keys; the first taken id only when one is.
local function first_taken(f)
  local total = f.n + f.steps - 1
  for s = 0, total - 1, CHUNK do
    local keys = {}
    for i = s, math.min(s + CHUNK, total) - 1 do
      local at = f.at + 4 * math.min(i, f.n) + 6 * math.max(0, i - f.n)
      keys[#keys + 1] = k_job(ARGV[at + 1], ARGV[at])
    end
    if redis.call('EXISTS', unpack(keys)) > 0 then
      for i = s, math.min(s + CHUNK, total) - 1 do
        local at = f.at + 4 * math.min(i, f.n) + 6 * math.max(0, i - f.n)
        if redis.call('EXISTS', k_job(ARGV[at + 1], ARGV[at])) == 1 then return ARGV[at] end
      end
    end
  end
  return nil
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
      for q, extra in pairs(adding) do
        added[q] = (added[q] or 0) + extra
        -- This flow's order numbers on q: the `extra` after the counter's current value.
        orders[q] = {next = redis.call('INCRBY', k_seq(q), extra) - extra}
      end
      local fid = f.id
      local mq, sq = {}, {}
      local held = {}
      for i = 0, f.n - 1 do
        local at = f.at + 4 * i
        local id, q, prio = ARGV[at], ARGV[at + 1], ARGV[at + 2]
        mq[#mq + 1] = q
        store(id, q, prio, ARGV[at + 3], {'s', 'w', 'fl', fid, 'fq', fq, 'fm', i})
        push_later(q, prio, id)
        count(q, 'w', 1)
        work_queues[q] = true
      end
      for k = 0, f.steps - 1 do
        local at = f.at + 4 * f.n + 6 * k
        local id, q, prio = ARGV[at], ARGV[at + 1], ARGV[at + 2]
        sq[#sq + 1] = q
      end
      for k = 0, f.steps - 1 do
        local at = f.at + 4 * f.n + 6 * k
        local id, q, prio = ARGV[at], ARGV[at + 1], ARGV[at + 2]
        -- The flow's own job keeps the flow's shape (for inspect, after the record ends,
        -- and for a retry that resumes the flow: the steps' queues).
        local shape = {}
        if k == f.steps - 1 then shape = {'fS', f.steps, 'fn', f.n, 'fsq', flow_queue_list(sq)} end
        if k == 0 and not f.fan_out then
          store(id, q, prio, ARGV[at + 3], {'s', 'w', 'fl', fid, 'fq', fq, 'fs', k, unpack(shape)})
          push_later(q, prio, id)
          count(q, 'w', 1)
          work_queues[q] = true
        else
          store(id, q, prio, ARGV[at + 3], {'s', 's', 'r', HELD_US, 'fl', fid, 'fq', fq, 'fs', k,
            'mh', ARGV[at + 4], 'mt', ARGV[at + 5], unpack(shape)})
          held[#held + 1] = {q, id}
          count(q, 's', 1)
        end
      end
      for _, h in ipairs(held) do redis.call('ZADD', k_sched(h[1]), HELD_US, h[2]) end
      flush_pushes()
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
