#!lua
-- Store jobs of one flow across slots (Redis Cluster) that live on one queue, before
-- the root: a chunk of its members (on any queue, the root's too: the client sends them
-- a bounded chunk per call, typedq/broker/redis/flows.py's part_chunks) and its steps on
-- a queue other than the root's (the queue of the flow's own job), held and pending
-- (fp), so none runs before the root's record exists. The root's flow_enqueue starts
-- them through the outbox ('A' records: a chunk of members each; 'a': steps, a chain's
-- step 0 to waiting); when the root refuses the flow, the client drops them ('A' with
-- mode 'd', 'D'). A pending job of the flow already there (an earlier copy of this call)
-- is kept. Refused at maxmemory, like enqueue.
-- KEYS[1] = the queue's order counter
-- ARGV: P, max_queue_length, queue, flow id F, root queue fq, steps S, the steps' queues
--   (as flow records store them), members here n, their priority, n x (index i, body)
--   (member i is F.m<i>), steps here m, m x (k, priority, body, head, tail)
-- Returns 1 stored, 0 every job was there already, or why it was refused:
-- 'TYPEDQ_QUEUE_FULL q pending extra limit' or 'TYPEDQ_FLOW_ID_TAKEN id'.
local limit, q, f, fq = tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]
local steps, fsq, n, mprio = tonumber(ARGV[6]), ARGV[7], tonumber(ARGV[8]), ARGV[9]
if not limit or not q or q == '' or not f or f == '' or not fq or fq == '' or not is_int(steps)
    or steps < 1 or not is_int(n) or n < 0 or not is_int(mprio) then
  return bad_args('flow_part')
end
local ms = 10 + 2 * n
for i = 0, n - 1 do
  if not is_int(ARGV[10 + 2 * i]) then return bad_args('flow_part') end
end
local m = tonumber(ARGV[ms])
if not is_int(m) or m < 0 or #ARGV ~= ms + 5 * m then return bad_args('flow_part') end
for j = 0, m - 1 do
  local k = tonumber(ARGV[ms + 1 + 5 * j])
  if not is_int(k) or k < 0 or k >= steps - 1 or not is_int(ARGV[ms + 2 + 5 * j]) then
    return bad_args('flow_part')
  end
end

-- Which jobs are missing; an id held by a job of another flow (or of none) refuses it.
local todo = {}
for i = 0, n - 1 do
  local at = 10 + 2 * i
  todo[#todo + 1] = {f .. '.m' .. ARGV[at], ARGV[at], at + 1}
end
for j = 0, m - 1 do
  local at = ms + 1 + 5 * j
  todo[#todo + 1] = {flow_step_id(f, tonumber(ARGV[at]), steps), false, at}
end
-- (One EXISTS for the chunk's job keys: none, the usual answer, leaves only the waiting
-- index to look at per id.)
local keyed = true
if #todo <= 1000 then
  local keys = {}
  for i, t in ipairs(todo) do keys[i] = k_job(q, t[1]) end
  keyed = #keys > 0 and redis.call('EXISTS', unpack(keys)) > 0
end
local missing = {}
for _, t in ipairs(todo) do
  -- A waiting entry of another job has no key, only its id in the index (job_exists).
  local there
  if keyed then
    there = job_exists(q, t[1])
  else
    there = redis.call('HEXISTS', k_idx(q, t[1]), t[1]) == 1
  end
  if there then
    -- Kept only while pending (fp): stored by an earlier copy of this call whose root
    -- never ran. A job of an earlier life of the flow (started, run, finished: its own
    -- job since removed) takes the id like any other job, as on one Redis.
    local r = read_hash(q, t[1], 'fl', 'fp')
    if not r or r[1] ~= f or not r[2] then return 'TYPEDQ_FLOW_ID_TAKEN ' .. t[1] end
  else
    missing[#missing + 1] = t
  end
end
if #missing == 0 then return 0 end
if limit > 0 then
  local c = redis.call('HMGET', k_counts(q), 'w', 's')
  local pending = (tonumber(c[1]) or 0) + (tonumber(c[2]) or 0)
  if pending + #missing > limit then
    return string.format('TYPEDQ_QUEUE_FULL %s %d %d %d', q, pending, #missing, limit)
  end
end
local now = now_us()
local o = redis.call('INCRBY', k_seq(q), #missing) - #missing
local sched = {}
for _, t in ipairs(missing) do
  o = o + 1
  local id, at = t[1], t[3]
  local v = {'q', q, 'o', o, 'e', now, 's', 's', 'r', HELD_US, 'fl', f, 'fq', fq, 'fx', '1',
    'fp', '1'}
  local prio
  if t[2] then
    prio = mprio
    v[19], v[20], v[21], v[22] = 'm', ARGV[at], 'fm', t[2]
  else
    prio = ARGV[at + 1]
    -- A chain's step 0 holds its whole body (it starts with its input); a later step
    -- its body split around the payload, as flow_enqueue stores it.
    for _, x in ipairs({'m', ARGV[at + 2], 'fs', ARGV[at], 'fS', steps, 'fsq', fsq}) do
      v[#v + 1] = x
    end
    if ARGV[at + 3] ~= '' or ARGV[at + 4] ~= '' then
      for _, x in ipairs({'mh', ARGV[at + 3], 'mt', ARGV[at + 4]}) do v[#v + 1] = x end
    end
  end
  if prio ~= '0' then v[#v + 1] = 'p'; v[#v + 1] = prio end
  redis.call('HSET', k_job(q, id), unpack(v))
  sched[#sched + 1] = HELD_US
  sched[#sched + 1] = id
end
-- (One ZADD per call: a call holds a bounded chunk of jobs, well below unpack's limit.)
redis.call('ZADD', k_sched(q), unpack(sched))
count(q, 's', #missing)
flush_counts()
return 1
