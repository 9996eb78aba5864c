-- common/flow_settle.lua: Workflows: ending, releasing, fan-in and settling (applying
-- hand-offs and staged releases: common/flow_handoffs.lua, the part after this one).
-- (A part of the shared prelude, in the order of scripts.py's PARTS: README.md.)
-- A purge of queue q under way in this call (purge.lua sets it, and flow_apply's 'Z' for
-- a step of a flow's end a purge began): {q = queue, n = jobs it deleted through
-- purge_takes, states = the letters of every state it deletes (a set), letters = the
-- same as one string, spent = the jobs the call has passed so far (the purge's own and
-- its flows' ends', weighed by their cost: see purge.lua), budget = how many it may
-- pass}. nil in every other call.
local purging
-- A job of the flow a purge's deletion ends (or releases) is itself waiting or
-- scheduled on the purged queue in a purged state: the purge deletes it rather than end
-- it, as it would have had it come first (the embedded broker deletes all of them
-- before any flow reacts), so the outcome and the count do not depend on the order or
-- the batch the jobs fall in. True when it was deleted (the caller took its sorted-set
-- entry, or marked its waiting entry stale, already). `final`: the state the flow's end
-- would put it in: purged too, it goes now (the embedded broker's next round deletes
-- it there), as when a purge of the failed state deletes a parked job (fail.lua's 'pk')
-- whose flow then fails its held steps.
local function purge_takes(q, id, s, final)
  if not purging or purging.q ~= q or (s ~= 's' and s ~= 'w')
      or not (purging.states[s] or (final and purging.states[final])) then
    return false
  end
  rcall('DEL', k_job(q, id))
  count(q, s, -1)
  note_done(q, id)
  purging.n = purging.n + 1
  return true
end

-- Job `id` of queue `q` ends with its flow (see flow_end). False when it is gone.
local function flow_end_job(q, id, state, err, now)
  local r = read_hash(q, id, 's', 'q', 'p', 'a')
  if not r then return false end
  local s = r[1]
  if s == 'a' then
    rcall('HSET', k_job(q, id), 'cr', 1)
    publish_cancel(q, id)
  elseif s == 'w' or s == 's' then
    if s == 'w' then mark_stale(q, sane_prio(r[3]), id) else rcall('ZREM', k_sched(q), id) end
    local st = 'x'
    if err then st = state end
    if purge_takes(q, id, s, st) then return end
    local e = err
    if not e then
      -- (The record of a job cancelled with its flow, made once per attempt and clock
      -- reading: a flow's end makes hundreds of the same.)
      local a, c = tonumber(r[4]) or 0, flow_ops.cancelled_recs
      if not c or c.now ~= now then
        c = {now = now}
        flow_ops.cancelled_recs = c
      end
      e = c[a]
      if not e then
        e = failure_record(CANCELLED_REASON, CANCELLED_TYPE, CANCELLED_WITH_FLOW, a, nil, now)
        c[a] = e
      end
    end
    flow_links[k_job(q, id)] = false  -- its flow has ended: nothing to settle (no lookup)
    finalize(id, q, s, st, now, {'err', e})
  end
end

-- End a flow that did not complete: every job of it not final yet ends in `state`
-- with record `err` (nil: cancelled with the flow); a running one is asked to cancel.
-- `settled`: every member has settled (the fan-in found a failed one): only its steps
-- are left to end.
-- In bounded steps (issue 31: a 100,000-member flow's end was one script of ~1 s): this
-- call marks the flow's record ended (E: the state, Ee: the record when not nil, Ec: how
-- many of its jobs the end has passed, Eo: where member Ec's queue starts in a list of
-- several, Et: of how many jobs), in O(1), and ends the first END_CHUNK of its jobs
-- (flow_ops.end_step): its steps first (its own job, whose state is the flow's, in this
-- call), then its members. From the mark on, nothing of the flow goes on: a settling job
-- finds it ended (flow_settle), a claim ends a member it pops instead of starting it
-- (flow_ops.claim_ended), a staged member is never released (dropped here). A flow with
-- more jobs left writes an outbox entry {'Z', F, fq, entry id} to its own queue (see
-- common/flows.lua), which the caller applies (flow_apply.lua: deletes it, ends the next
-- chunk and writes the next entry) until the flow has ended, before its call returns;
-- the reaper pass hands back an entry its writer left (a client that died between two
-- chunks). The record goes with the last chunk. Under a purge (`purging`) too, in chunks
-- of the purge's budget left (its own job first: at least its steps, at most
-- END_CHUNK); the next step's entry carries the purge (its queue and states), so every
-- chunk deletes the jobs the purge would (purge_takes) and the purge's jobs and counts do
-- not depend on the batch or the chunk they fall in; the purge's caller applies those
-- entries (and counts what they delete) right after the call that wrote the first.
-- A flow across slots (Redis Cluster, `x`) ends its jobs on the root's queue so; those
-- on each other queue end there, by one outbox entry per queue ({'Y', F, fq, state, err,
-- S, members, mq, sq}), whose apply marks the flow ended on that slot (a hash of the
-- same fields, flow_ops.ending(q, F), which that slot's claims read) and ends that
-- queue's jobs the same way, a chunk per script through that queue's outbox.
local function flow_end(fq, f, state, err, now, settled)
  local fk = k_flow(fq, f)
  local meta = rcall('HMGET', fk, 'S', 'n', 'mq', 'sq', 'x', 'E', 'g')
  if not meta[1] or meta[6] then return end  -- ended already (or ending)
  local steps, n = tonumber(meta[1]), tonumber(meta[2])
  flow_ended[f] = true
  local upto = n
  if meta[7] then
    -- A staged fan-out's release under way: its unreleased members never run.
    local mq = meta[3]
    if not mq or mq == '' then mq = fq end
    upto = tonumber(meta[7]) or 0
    rcall('UNLINK', flow_ops.staged(mq, f))
    rcall('ZREM', flow_ops.releasing(mq), fq .. '|' .. f)
    rcall('HDEL', fk, 'g', 'go', 'gp', 'ge')
  end
  if settled then upto = 0 end
  rcall('HSET', fk, 'E', state, 'Ec', 0, 'Et', steps + upto)
  if err then rcall('HSET', fk, 'Ee', err) end  -- (absent: nil; '' is a record too)
  local x = meta[5] == '1'
  if x then
    -- The other queues of the flow (a list of several members' queues is read whole,
    -- once: as long as the list the flow's enqueue wrote).
    local others = {}
    for _, q in ipairs(flow_queues(meta[4], steps, fq)) do others[q] = true end
    if upto > 0 then
      for _, q in ipairs(flow_queues(meta[3], upto, fq)) do others[q] = true end
    end
    others[fq] = nil
    for q in pairs(others) do
      flow_outbox(fq, q, f .. '|e|' .. q,
        {'Y', f, fq, state, err or false, steps, upto, meta[3] or '', meta[4] or ''})
    end
  end
  local limit = flow_ops.END_CHUNK
  if purging then
    -- (A job a flow's end passes: 2 purge entries' worth; see purge.lua.)
    limit = math.min(limit, math.max(steps, (purging.budget - purging.spent) / 2))
  end
  local _, ended = flow_ops.end_step(fk, fq, fq, f, limit, now, x and fq)
  if purging then purging.spent = purging.spent + 2 * ended end
end

-- Jobs per step of a flow's end (see flow_end): ~12-25 µs of Redis time each, so a step
-- takes ~1.2-2.5 ms (bench/fanout_scripts.py --ends; 200 took 4-5 ms on a loaded box).
flow_ops.END_CHUNK = 100

-- Where a flow across slots is marked ended on queue q's slot (see flow_end).
function flow_ops.ending(q, f) return k_q(q) .. 'fE:' .. f end

-- The next `limit` jobs (nil: all) of flow F's end (see flow_end), marked in hash `mk`
-- (its record, or flow_ops.ending(home, F)); `home`: the queue whose outbox carries the
-- next step; `fq`: the flow's root queue; `only`: a queue (the jobs on other queues are
-- passed over: a flow across slots) or false. Returns how many jobs are left to pass
-- (0: ended; the mark is gone), and how many it ended (or found gone) now. Under a purge
-- (`purging`), the next step's entry carries it (see flow_end).
function flow_ops.end_step(mk, home, fq, f, limit, now, only)
  local meta = rcall('HMGET', mk, 'E', 'Ee', 'Ec', 'Et', 'S', 'n', 'mq', 'sq', 'Eo')
  if not meta[1] then return 0 end  -- ended already (or not ending: not this call's)
  flow_ended[f] = true
  local state, err = meta[1], meta[2] or nil
  local at, stop = tonumber(meta[3]) or 0, tonumber(meta[4]) or 0
  local steps, n = tonumber(meta[5]), tonumber(meta[6])
  local mq, sq = meta[7] or '', meta[8] or ''
  local sqs = flow_queues(sq, steps, fq)
  -- Members' queues: one name (or none: the root's) in O(1); a list of several is read
  -- from byte `pos` on (Eo), a name per member, never from its start again.
  local many = string.find(mq, ' ', 1, true) ~= nil
  local one = mq ~= '' and not many and mq or fq
  local pos = tonumber(meta[9]) or 1
  local ended, j = 0, at
  -- Jobs on other queues are passed over without a command: 20 of them per job ended.
  local cap = stop
  if limit then cap = math.min(stop, at + 20 * limit) end
  while j < cap and (not limit or ended < limit) do
    local q, id
    if j < steps then
      q, id = sqs[j + 1], flow_step_id(f, j, steps)
    else
      q = one
      if many then
        local sp = string.find(mq, ' ', pos, true)
        q = string.sub(mq, pos, (sp or #mq + 1) - 1)
        pos = (sp or #mq) + 1
        if q == '' then q = fq end
      end
      id = f .. '.m' .. (j - steps)
    end
    if not only or q == only then
      -- (A job gone already, one read: a quarter of one ended. A purge's ends meet
      -- thousands of those, the jobs the purge deleted itself.)
      if flow_end_job(q, id, state, err, now) == false then
        ended = ended + 0.25
      else
        ended = ended + 1
      end
    end
    j = j + 1
  end
  if j >= stop then
    rcall('UNLINK', mk)  -- (a large fan-out's record: freed off the main thread)
    return 0, ended
  end
  rcall('HSET', mk, 'Ec', j, 'Eo', pos)
  local eid = f .. '|z|' .. j
  local rec = {'Z', f, fq, eid, mk ~= k_flow(fq, f)}
  if purging then rec[6], rec[7] = purging.q, purging.letters end
  flow_outbox(home, home, eid, rec)
  return stop - j, ended
end

-- A claim popped waiting job `id` of queue q, of flow F (its root queue fq; `x`: a flow
-- across slots): when F is ending (flow_end marked it, on this slot, and its end has not
-- reached this job yet), the job ends here, as the end would have ended it, instead of
-- starting. `attempt`: its 'a'. True when it ended.
function flow_ops.claim_ended(q, id, f, fq, x, attempt, now)
  local mk = k_flow(fq, f)
  if x and q ~= fq then mk = flow_ops.ending(q, f) end
  local e = rcall('HMGET', mk, 'E', 'Ee')
  if not e[1] then return false end
  local st, err = 'x', e[2]
  if err then
    st = e[1]
  else
    err = failure_record(CANCELLED_REASON, CANCELLED_TYPE, CANCELLED_WITH_FLOW,
      tonumber(attempt) or 0, nil, now)
  end
  rcall('HSET', k_job(q, id), 'err', err)
  finalize(id, q, 'w', st, now)
  return true
end

-- Give held step k (job `id` on queue q) its input: waiting now, or (a collector)
-- completed with it. In a flow across slots (`x`), a step that is no longer held was
-- released already (or ended with its flow): nothing to do; a missing one breaks the
-- flow, at its root (through the outbox when the root is not `home`). `links`: the
-- members' spans, for a fan-in callback (comma-separated traceparents).
local function flow_release_at(q, id, fq, f, k, steps, collector, payload, now, x, home, links)
  local jk = k_job(q, id)
  local r = read_hash(q, id, 's', 'q', 'mh', 'mt', 'p')
  if r and r[1] == 's' and purging and purging.q == q then
    rcall('ZREM', k_sched(q), id)
    if purge_takes(q, id, 's') then r = nil end
  end
  if not r or r[1] ~= 's' or not r[3] then
    if x and r then return false end
    local broken = failure_record(FLOW_BROKEN_REASON, FLOW_BROKEN_TYPE, FLOW_BROKEN, 0, nil, now)
    if x and fq ~= home then
      flow_outbox(home, fq, id .. '|b', {'e', f, fq, 'f', broken})
    else
      flow_end(fq, f, 'f', broken, now)
    end
    return false
  end
  rcall('ZREM', k_sched(q), id)
  if collector and k == steps - 1 then
    rcall('HDEL', jk, 'mh', 'mt', 'r')
    rcall('HSET', jk, 'res', payload)
    finalize(id, q, 's', 'c', now)
    return true
  end
  -- At the head of its priority level: a flow under way finishes before new work starts,
  -- instead of its next step or callback queueing behind the members of every flow
  -- enqueued since (O(1); the embedded broker does the same).
  rcall('HDEL', jk, 'mh', 'mt')
  local head, tail = r[3], r[4]
  -- A traced callback (its body has every field up to its trace context: 12) gets its
  -- members' span links as the body's 13th field, trace_links: appended to a body of
  -- 12 fields, put in place of the empty one in a fair job's body (all 16 fields).
  if links and links ~= '' then
    if string.byte(head, 1) == 156 then
      head, tail = '\157' .. string.sub(head, 2), tail .. msgpack_str(links)
    elseif string.byte(head, 1) == 0xdc and string.byte(head, 3) == 16 then
      tail = flow_ops.with_links(tail, links)
    end
  end
  -- Due from the hand-off (its queue wait does not include the steps before it).
  local body = head .. msgpack_bin(payload) .. tail
  rcall('HSET', jk, 'm', body, 's', 'w', 'r', now)
  local prio = sane_prio(r[5])
  local group, weight = fair_of(body)
  if group then
    -- A fair task's step (typedq.fair) goes first in its key's lane, ahead of the key's
    -- waiting jobs, and the key's marker keeps its place (and its weight: the step is
    -- no new job); a key with none waiting takes its turn at the head of the level,
    -- with the step's weight (memory/lines.py Level.push_fair).
    if rcall('RPUSH', k_lane(q, group, prio), id) == 1 then
      rcall('RPUSH', k_wait(q, prio), '~0|' .. weight .. '|' .. group)
      rcall('ZADD', k_levels(q), level_score(prio), prio)
      rcall('HSET', k_lanes(q), prio .. '|' .. group, weight)
    end
  else
    push_waiting(q, prio, id, true)
  end
  count(q, 's', -1)
  count(q, 'w', 1)
  work_queues[q] = true
  return true
end

-- The tail of a fair callback's body (its fields after the payload: fingerprint, ...,
-- fair_weight; redis/codec.py) with trace_links (its 11th) set to `links`, when its
-- trace context (the 10th) is not empty (the embedded broker links only a traced
-- callback); the tail unchanged otherwise (or bytes not seen as a body).
function flow_ops.with_links(tail, links)
  local i = 1
  for _ = 1, 9 do
    i = mp_skip(tail, i)
    if not i then return tail end
  end
  if string.byte(tail, i) == 0xa0 then return tail end  -- no trace context
  i = mp_skip(tail, i)
  local after = i and mp_skip(tail, i)
  if not after then return tail end
  return string.sub(tail, 1, i - 1) .. msgpack_str(links) .. string.sub(tail, after)
end

-- Give held step k its input (flow_release_at). `sq`: the flow record's 'sq' (or a
-- step's 'fsq') when the caller read it already (nil: read here). `x`, `home`: a flow
-- across slots, run on `home`'s slot (nil: the root's): a step on another queue gets
-- its input through the outbox. `links`: see flow_release_at.
local function flow_release(fq, f, k, steps, collector, payload, now, sq, x, home, links)
  local id = flow_step_id(f, k, steps)
  if sq == nil then sq = rcall('HGET', k_flow(fq, f), 'sq') end
  local q = flow_queues(sq, steps, fq)[k + 1]
  home = home or fq
  if x and q ~= home then
    flow_outbox(home, q, id .. '|r',
      {'r', f, fq, k, steps, collector and '1' or '0', payload, links or false})
    return
  end
  flow_release_at(q, id, fq, f, k, steps, collector, payload, now, x, home, links)
end

-- Members s..e's elements, joined in input order (a member with none: nil). (A field
-- of flow_ops, common/flows.lua: the library's main chunk is at its 200 locals.)
function flow_ops.elements(fk, s, e)
  local names = {}
  for i = s, e do names[#names + 1] = 'r' .. i end
  local got = rcall('HMGET', fk, unpack(names))
  for j = 1, #got do got[j] = got[j] or '\192' end
  return table.concat(got)
end

-- Every member settled: fail the flow (a member failed, default policy) or release
-- step 0 with the msgpack array of the members' elements, in input order. A fan-out of
-- more than 1000 members was joined a block of 1000 at a time as each block settled
-- (b<k>, flow_settle): here only the blocks are joined, so no one script reads every
-- member's element (a block its settles did not join, read here: one HMGET).
local function flow_fan_in(fq, f, steps, n, collector, now)
  local fk = k_flow(fq, f)
  local names = {'fi', 'fst', 'fe', 'mq', 'sq', 'x', 'L'}
  local blocks = n > 1000
  if not blocks then
    for i = 0, n - 1 do names[#names + 1] = 'r' .. i end
  end
  local vals = rcall('HMGET', fk, unpack(names))
  if vals[1] then
    flow_end(fq, f, vals[2], vals[3], now, true)
    return
  end
  local parts = {msgpack_array_header(n)}
  for j = 8, #vals do parts[#parts + 1] = vals[j] or '\192' end
  if blocks then
    local bn = {}
    for k = 0, math.floor((n - 1) / 1000) do bn[#bn + 1] = 'b' .. k end
    local got = rcall('HMGET', fk, unpack(bn))
    for j = 1, #bn do
      local s = (j - 1) * 1000
      parts[#parts + 1] = got[j] or flow_ops.elements(fk, s, math.min(s + 999, n - 1))
    end
  end
  local links = nil
  if vals[7] then
    local ln = {}
    for i = 0, math.min(n, MAX_SPAN_LINKS) - 1 do ln[#ln + 1] = 'l' .. i end
    local t = {}
    for _, v in ipairs(rcall('HMGET', fk, unpack(ln))) do
      if v then t[#t + 1] = v end
    end
    links = table.concat(t, ',')
  end
  -- The payload carries the results now: the flow record keeps only its shape. (UNLINK:
  -- a record of many members' results is freed off the main thread.)
  rcall('UNLINK', fk)
  rcall('HSET', fk, 'S', steps, 'n', n, 'c', 0, 'col', collector and '1' or '0',
    'mq', vals[4] or '', 'sq', vals[5] or '')
  local x = vals[6] == '1'
  if x then rcall('HSET', fk, 'x', '1') end
  flow_release(fq, f, 0, steps, collector, table.concat(parts), now, vals[5] or false, x, nil,
    links)
end

-- A job of a flow across slots settled on queue q, not its flow's root: a member
-- reports to the root, a completed step releases the next one (here or through the
-- outbox), a step that failed or was cancelled ends the flow at the root. `ext`: the
-- job's fx, fS, fsq. (The last step is the flow's own job, always at the root.)
local function flow_settle_away(q, id, fq, f, fm, fs, state, res, err, now, ext)
  if fm then
    flow_outbox(q, fq, id .. '|m',
      {'m', f, fq, fm, state, res or false, err or false, span_links[id] or false})
  elseif state == 'c' then
    flow_release(fq, f, tonumber(fs) + 1, tonumber(ext[2]), false, res or '\192', now,
      ext[3] or false, true, q)
  else
    flow_outbox(q, fq, id .. '|e', {'e', f, fq, state, err or false})
  end
end

-- `q`, `id`: the settled job (nil: applied at the root for it); `ext`: its fx, fS,
-- fsq when read already (a removed job's, read before it went).
flow_settle = function(fq, f, fm, fs, state, res, err, now, q, id, ext)
  if flow_ended[f] then return end
  if q and q ~= fq then
    ext = ext or rcall('HMGET', k_job(q, id), 'fx', 'fS', 'fsq')
    if ext[1] == '1' then
      -- (Its flow's end under way on this slot, flow_end's 'Y': nothing goes on.)
      if rcall('EXISTS', flow_ops.ending(q, f)) == 0 then
        flow_settle_away(q, id, fq, f, fm, fs, state, res, err, now, ext)
      end
      return
    end
  end
  local fk = k_flow(fq, f)
  local meta = rcall('HMGET', fk, 'S', 'n', 'col', 'pol', 'x', 'E')
  -- The flow has ended (or is ending: flow_end): a late member or a cancelled step.
  if not meta[1] or meta[6] then return end
  local steps, collector, x = tonumber(meta[1]), meta[3] == '1', meta[5] == '1'
  if fm then
    local i = tonumber(fm)
    -- (A member's settlement: ~4 purge entries' worth of Redis time; see purge.lua.)
    if purging then purging.spent = purging.spent + 4 end
    -- r<i>: its element and its settled mark (set once); '' for a failed one ('a').
    local el = ''
    if meta[4] == 'c' then
      if state == 'c' then el = '\146\162ok' .. (res or '\192')
      else el = '\146\166failed' .. (err or '\192') end
    elseif state == 'c' then
      el = res or '\192'
    end
    if rcall('HSETNX', fk, 'r' .. i, el) == 0 then return end
    local n = tonumber(meta[2])
    if n > 1000 then
      -- A block of 1000 members all settled: its elements joined once, now (b<k>), so
      -- the fan-in joins blocks, not every member's element (bc<k>: settled in block k).
      local k = math.floor(i / 1000)
      local s = k * 1000
      local e = math.min(s + 999, n - 1)
      if rcall('HINCRBY', fk, 'bc' .. k, 1) == e - s + 1 then
        rcall('HSET', fk, 'b' .. k, flow_ops.elements(fk, s, e))
      end
    end
    -- k<state letter>: settled members per final state, for inspect (flow_info.lua).
    rcall('HINCRBY', fk, 'k' .. state, 1)
    local link = span_links[f .. '.m' .. i]
    if link and i < MAX_SPAN_LINKS then rcall('HSET', fk, 'l' .. i, link, 'L', 1) end
    if meta[4] ~= 'c' and state ~= 'c' then
      local fi = tonumber(rcall('HGET', fk, 'fi'))
      if not fi or i < fi then
        rcall('HSET', fk, 'fi', i, 'fst', state, 'fe', err or '\192')
      end
    end
    if rcall('HINCRBY', fk, 'c', -1) == 0 then
      flow_fan_in(fq, f, steps, tonumber(meta[2]), collector, now)
    end
    return
  end
  local k = tonumber(fs)
  if state == 'c' then
    if k == steps - 1 then
      rcall('DEL', fk)
    else
      flow_release(fq, f, k + 1, steps, collector, res or '\192', now, nil, x)
    end
  elseif k == steps - 1 and state == 'x' then
    flow_end(fq, f, 'x', nil, now)  -- the flow's own job was cancelled first: stop the rest
  else
    flow_end(fq, f, state, err, now)
  end
end
