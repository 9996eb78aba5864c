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
--   the members' queues (one name when all share it, else one per member, space-
--   separated; '' when n = 0) and priority (one task: all alike), across
--   ('1': a flow across slots on Redis Cluster, this call its root's part; 's': a large
--   fan-out whose members are staged; else '0'), n x body (member i's id is <id>.m<i>;
--   none when staged; across: instead k, then k x (queue, from, to), the chunks its
--   parts stored the members in), S x (id, queue, priority, body, head, tail)
-- A large fan-out (typedq/broker/redis/staging.py): flow_stage.lua staged its members
-- (one queue, the root's slot) before this call, which stores the flow with them still
-- staged (the record's g/go/gp/ge, see flow_ops.release in common/flow_settle.lua): then
-- flow_open.lua releases them, a bounded chunk per call. Its staged members missing
-- (expired, or a chunk was refused): 'TYPEDQ_FLOW_UNSTAGED', nothing stored.
-- A flow across slots: flow_part.lua stored (held, pending) its members, and its steps
-- on every other queue, before this call, a bounded chunk per call; this call stores
-- the steps on the queue of the flow's own job and the record (x '1'), and starts the
-- others through its outbox (common/flows.lua): one entry per chunk of members ('A',
-- flow_ops.start_range, each applied by a script of its own) and one per other queue
-- of its steps ('a'). It handles no member itself: its cost is O(steps + chunks).
-- Returns per flow: 1 created, 0 existed, or why it was refused:
-- 'TYPEDQ_QUEUE_FULL q pending extra limit' or 'TYPEDQ_FLOW_ID_TAKEN id'.
--
-- Cost: a member is one argument and one HSET; everything else of a flow is O(1)
-- commands (one INCRBY per queue for the order numbers, one EXISTS per 1000 derived
-- ids, one LPUSH per 1000 waiting ids), so a large fan-out is one short script.
local limit, m = tonumber(ARGV[2]), tonumber(ARGV[3])
if not limit or not is_int(m) or m < 0 then return bad_args('flow_enqueue') end
local function bad_queue(q) return not q or q == '' or string.find(q, '|', 1, true) end
-- The members' queues, one per member (nil: not n of them).
local function member_queues(list, n)
  local t = {}
  for name in string.gmatch(list, '[^ ]+') do
    if bad_queue(name) then return nil end
    t[#t + 1] = name
  end
  if #t == 1 then for i = 2, n do t[i] = t[1] end end
  if #t ~= n then return nil end
  return t
end
local flows = {}
local b = 4
for _ = 1, m do
  local f = {id = ARGV[b], steps = tonumber(ARGV[b + 1]), n = tonumber(ARGV[b + 2]),
    fan_out = ARGV[b + 3] == '1', collector = ARGV[b + 4] == '1', pol = ARGV[b + 5],
    mq = ARGV[b + 6], mprio = ARGV[b + 7], across = ARGV[b + 8] == '1',
    staged = ARGV[b + 8] == 's'}
  if not f.id or f.id == '' or not is_int(f.steps) or f.steps < 1 or not is_int(f.n)
      or f.n < 0 or (f.n > 0 and (not f.mq or not is_int(f.mprio))) then
    return bad_args('flow_enqueue')
  end
  if f.staged then
    -- (one queue: not one entry per member)
    if f.n == 0 or bad_queue(f.mq) or string.find(f.mq, ' ', 1, true) then
      return bad_args('flow_enqueue')
    end
    f.mqs = {f.mq}
  elseif f.across then
    -- (The members' queue list is stored whole, not read: the chunks name their queues.)
    f.mqs = {}
  else
    f.mqs = f.n > 0 and member_queues(f.mq, f.n) or {}
  end
  if not f.mqs then return bad_args('flow_enqueue') end
  f.at = b + 9             -- the first member's body (across: how many chunks)
  if f.across then
    local k = tonumber(ARGV[f.at])
    if not is_int(k) or k < 0 or f.at + 3 * k > #ARGV then return bad_args('flow_enqueue') end
    f.chunks = {}
    for j = 0, k - 1 do
      local at = f.at + 1 + 3 * j
      local from, to = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
      if bad_queue(ARGV[at]) or not is_int(from) or not is_int(to) or from < 0 or to <= from
          or to > f.n then
        return bad_args('flow_enqueue')
      end
      f.chunks[#f.chunks + 1] = {ARGV[at], from, to}
    end
    f.st = f.at + 1 + 3 * k
  else
    f.st = f.at + (f.staged and 0 or f.n)  -- the first step's id
  end
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
local function first_taken(f, fq)
  local ids = {}
  for k = 0, f.steps - 2 do
    local at = f.st + 6 * k
    if not f.across or ARGV[at + 1] == fq then ids[#ids + 1] = {ARGV[at + 1], ARGV[at]} end
  end
  local keys, names, queues = {}, {}, {}
  -- (Staged members: flow_stage.lua checked theirs; flow_ops.release checks them again.)
  for i = 0, (f.staged or f.across) and -1 or f.n - 1 do
    local q = f.mqs[i + 1]
    if not f.across or q == fq then
      keys[#keys + 1] = k_job(q, f.id .. '.m' .. i)
      names[#names + 1] = f.id .. '.m' .. i
      queues[#queues + 1] = q
    end
    if #keys == CHUNK or (i == f.n - 1 and #keys > 0) then
      if redis.call('EXISTS', unpack(keys)) > 0 then
        for j = 1, #keys do
          if redis.call('EXISTS', keys[j]) == 1 then return names[j] end
        end
      end
      -- A waiting entry has no key: its id is in its queue's index (see keys.py).
      for j = 1, #names do
        if redis.call('HEXISTS', k_idx(queues[j], names[j]), names[j]) == 1 then
          return names[j]
        end
      end
      keys, names, queues = {}, {}, {}
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
    -- A re-sent large fan-out staged its members again: dropped, unless the stored
    -- flow's own release is still under way (it reads them).
    if f.staged and redis.call('HEXISTS', k_flow(fq, f.id), 'g') == 0 then
      redis.call('UNLINK', flow_ops.staged(f.mqs[1], f.id))
    end
    -- Across slots, a flow that has ended: what this copy's parts stored on the other
    -- queues (jobs the ended flow's retention had dropped) is pending and never started
    -- by anyone: drop it (flow_apply 'D': pending held jobs only). A running flow's
    -- pending jobs are left alone (a racing copy of this enqueue may be starting them).
    if f.across and redis.call('EXISTS', k_flow(fq, f.id)) == 0 then
      local recs = {}
      for k = 0, f.steps - 2 do
        local q = ARGV[f.st + 6 * k + 1]
        if q ~= fq then
          if not recs[q] then recs[q] = {'D', f.id, fq} end
          recs[q][#recs[q] + 1] = ARGV[f.st + 6 * k]
        end
      end
      for q, rec in pairs(recs) do flow_outbox(fq, q, f.id .. '|D|' .. q, rec) end
      -- (The members, a chunk per entry: on the root's queue too, where a part stored
      -- them.)
      for _, c in ipairs(f.chunks) do
        flow_outbox(fq, c[1], f.id .. '|Ad|' .. c[1] .. '|' .. c[2],
          {'A', f.id, fq, c[2], c[3], 'd'})
      end
    end
  else
    local adding, refused = {}, nil
    -- Across slots: only the jobs on fq are this call's (here: local).
    local function here(q) return not f.across or q == fq end
    if f.staged then
      adding[f.mq] = f.n
    elseif not f.across then
      for i = 1, f.n do
        local q = f.mqs[i]
        if here(q) then adding[q] = (adding[q] or 0) + 1 end
      end
    end
    local sq = {}
    for k = 0, f.steps - 1 do
      local q = ARGV[f.st + 6 * k + 1]
      sq[#sq + 1] = q
      if here(q) then adding[q] = (adding[q] or 0) + 1 end
    end
    -- A derived id (F.m<i>, F.<k>) taken by another job: refused, nothing stored.
    local taken = first_taken(f, fq)
    if taken then refused = 'TYPEDQ_FLOW_ID_TAKEN ' .. taken end
    if f.staged and not refused and redis.call('HLEN', flow_ops.staged(f.mqs[1], f.id)) ~= f.n then
      refused = 'TYPEDQ_FLOW_UNSTAGED'
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
      if f.staged then redis.call('UNLINK', flow_ops.staged(f.mqs[1], f.id)) end
    else
      -- This flow's order numbers on each queue: one INCRBY reserves them all, handed
      -- out in the order the jobs are stored (members, then steps), as one INCR each would.
      local order = {}
      for q, extra in pairs(adding) do
        added[q] = (added[q] or 0) + extra
        order[q] = redis.call('INCRBY', k_seq(q), extra) - extra
      end
      local fid = f.id
      local fx = f.across and '1' or nil
      local staged_from = nil  -- staged members: the order number before member 0's
      if f.staged then
        staged_from = order[f.mqs[1]]
        order[f.mqs[1]] = staged_from + f.n
      elseif f.n > 0 and not f.across then
        local prio = f.mprio
        local pend = {}  -- per queue: the ids not pushed yet (one LPUSH per CHUNK)
        for i = 0, f.n - 1 do
          local q = f.mqs[i + 1]
          if here(q) then
            local o = order[q] + 1
            order[q] = o
            local jk = k_job(q, fid .. '.m' .. i)
            if fx then
              redis.call('HSET', jk, 'm', ARGV[f.at + i], 'q', q, 'o', o, 'e', now, 'p', prio,
                's', 'w', 'fl', fid, 'fq', fq, 'fm', i, 'fx', fx)
            elseif prio ~= '0' then
              redis.call('HSET', jk, 'm', ARGV[f.at + i], 'q', q, 'o', o, 'e', now, 'p', prio,
                's', 'w', 'fl', fid, 'fq', fq, 'fm', i)
            else
              redis.call('HSET', jk, 'm', ARGV[f.at + i], 'q', q, 'o', o, 'e', now,
                's', 'w', 'fl', fid, 'fq', fq, 'fm', i)
            end
            local ids = pend[q]
            if not ids then
              ids = {}
              pend[q] = ids
            end
            local group, weight = fair_of(ARGV[f.at + i])
            if group then
              -- A fair task's member (typedq.fair) waits in its key's lane.
              lane_push(q, prio, fid .. '.m' .. i, group, weight)
            else
              ids[#ids + 1] = fid .. '.m' .. i
            end
            if #ids == CHUNK then
              redis.call('LPUSH', k_wait(q, prio), unpack(ids))
              pend[q] = {}
            end
            count(q, 'w', 1)
          end
        end
        for q, ids in pairs(pend) do
          if #ids > 0 then redis.call('LPUSH', k_wait(q, prio), unpack(ids)) end
          redis.call('ZADD', k_levels(q), -tonumber(prio), prio)
          work_queues[q] = true
        end
      end
      for k = 0, f.steps - 1 do
        local at = f.st + 6 * k
        local id, q, prio = ARGV[at], ARGV[at + 1], ARGV[at + 2]
        if here(q) then
          order[q] = order[q] + 1
          local t = {'m', ARGV[at + 3], 'q', q, 'o', order[q], 'e', now, 'fl', fid, 'fq', fq,
            'fs', k}
          if prio ~= '0' then t[#t + 1] = 'p'; t[#t + 1] = prio end
          if fx then t[#t + 1] = 'fx'; t[#t + 1] = fx end
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
      end
      local pol = 'a'
      if f.pol == 'c' then pol = 'c' end
      local col = '0'
      if f.collector then col = '1' end
      redis.call('HSET', k_flow(fq, fid), 'S', f.steps, 'n', f.n, 'c', f.n, 'col', col,
        'pol', pol, 'mq', f.n > 0 and f.mq or '', 'sq', flow_queue_list(sq))
      if staged_from then
        local q = f.mqs[1]
        redis.call('HSET', k_flow(fq, fid), 'g', 0, 'go', staged_from, 'gp', f.mprio, 'ge', now)
        redis.call('PERSIST', flow_ops.staged(q, fid))
        redis.call('ZADD', flow_ops.releasing(q), now, fq .. '|' .. fid)
      end
      if f.across then
        redis.call('HSET', k_flow(fq, fid), 'x', '1')
        -- Start the jobs the parts stored: the members a chunk per entry ('A', to
        -- waiting), the steps on the other queues one entry per queue ('a': a chain's
        -- step 0 to waiting, every step no longer pending).
        for _, c in ipairs(f.chunks) do
          flow_outbox(fq, c[1], fid .. '|A|' .. c[1] .. '|' .. c[2], {'A', fid, fq, c[2], c[3]})
        end
        local recs = {}
        for k = 0, f.steps - 1 do
          local q = sq[k + 1]
          if not here(q) then
            if not recs[q] then recs[q] = {'a', fid, fq, 0} end
            local rec = recs[q]
            rec[#rec + 1] = ARGV[f.st + 6 * k]
            if k == 0 and not f.fan_out then rec[4] = 1 end
          end
        end
        for q, rec in pairs(recs) do flow_outbox(fq, q, fid .. '|a|' .. q, rec) end
      end
      if f.fan_out and f.n == 0 then flow_fan_in(fq, fid, f.steps, 0, f.collector, now) end
      out[fi] = 1
    end
  end
end
-- Remembered only when every flow got a 0/1 answer (a refused one stored nothing, and
-- a re-sent copy decides it again).
-- (Counted, not read off #digits: with a refused flow between answered ones the table
-- has a hole, and # of a table with a hole may be any border, m too.)
local digits, answered = {}, 0
for i = 1, m do
  if type(out[i]) == 'number' then
    digits[i] = tostring(out[i])
    answered = answered + 1
  end
end
if answered == m and m > 0 then redis.call('SET', KEYS[2], table.concat(digits), 'PX', REQ_TTL_MS) end
flush_counts()
publish()
return flow_reply(out)
