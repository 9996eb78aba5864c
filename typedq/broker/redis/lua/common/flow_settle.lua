-- common/flow_settle.lua: Workflows: ending, releasing, fan-in, settling and applying hand-offs.
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
    i = fair_skip(tail, i)
    if not i then return tail end
  end
  if string.byte(tail, i) == 0xa0 then return tail end  -- no trace context
  i = fair_skip(tail, i)
  local after = i and fair_skip(tail, i)
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

-- Start (or, `drop`, drop) the pending members F.m<from> .. F.m<to - 1> of flow F that
-- are on queue q (a flow across slots: flow_part.lua stored them held and pending, a
-- bounded chunk per call; the root's flow_enqueue writes one {'A', F, fq, from, to, mode}
-- entry per such chunk, so no script starts more than a chunk). A member of the range on
-- another queue has no job here and is passed over; one started already (an entry
-- applied twice) is left as it is. Started: waiting, in index order, as flow_enqueue
-- would have stored it. Dropped (its root refused the flow, or found it ended): deleted
-- while still held and pending. 1 when it changed something.
function flow_ops.start_range(q, f, from, to, drop)
  local changed, held, gone, waiting = 0, {}, 0, {}
  for i = from, to - 1 do
    local id = f .. '.m' .. i
    local r = read_hash(q, id, 's', 'fp', 'p', 'fl')
    if r and r[2] and r[4] == f and (r[1] == 's' or not drop) then
      changed = 1
      local jk = k_job(q, id)
      if r[1] == 's' then held[#held + 1] = id end
      if drop then
        rcall('DEL', jk)
        gone = gone + 1
      elseif r[1] == 's' then
        rcall('HDEL', jk, 'fp', 'r')
        rcall('HSET', jk, 's', 'w')
        local prio = sane_prio(r[3])
        if not waiting[prio] then waiting[prio] = {} end
        local ids = waiting[prio]
        ids[#ids + 1] = id
      else
        rcall('HDEL', jk, 'fp')
      end
    end
  end
  -- (One command per chunk, not per member, where it can: ~250 ids per call at most.)
  if #held > 0 then rcall('ZREM', k_sched(q), unpack(held)) end
  if drop then
    count(q, 's', -gone)
    return changed
  end
  for prio, ids in pairs(waiting) do
    -- (As push_waiting does one by one: each id pushed at the head, in index order.)
    rcall('LPUSH', k_wait(q, prio), unpack(ids))
    rcall('ZADD', k_levels(q), level_score(prio), prio)
    count(q, 's', -#ids)
    count(q, 'w', #ids)
    work_queues[q] = true
  end
  return changed
end

-- Apply one outbox record (see above) on the slot of queue q: 1 when it changed
-- something, 0 when it had been applied already (or its flow has ended).
local function flow_apply(q, rec, now)
  local kind, f, fq = rec[1], rec[2], rec[3]
  if kind == 'A' then
    local from, to = tonumber(rec[4]), tonumber(rec[5])
    if not is_int(from) or not is_int(to) then return 0 end
    return flow_ops.start_range(q, f, from, to, rec[6] == 'd')
  elseif kind == 'm' then
    local fk = k_flow(fq, f)
    local r = rcall('HMGET', fk, 'S', 'E', 'r' .. rec[4])
    if not r[1] or r[2] or r[3] then return 0 end
    -- The member's process span, for the fan-in's span links (flow_settle reads it).
    if rec[8] then span_links[f .. '.m' .. rec[4]] = rec[8] end
    flow_settle(fq, f, rec[4], nil, rec[5], rec[6] or nil, rec[7] or nil, now)
    return 1
  elseif kind == 'e' then
    local r = rcall('HMGET', k_flow(fq, f), 'S', 'E')
    if not r[1] or r[2] then return 0 end
    flow_end(fq, f, rec[4], rec[5] or nil, now)
    return 1
  elseif kind == 'Z' then
    -- The next step of a flow's end (flow_end; 0: it had ended), on queue q (the flow's
    -- root, or one of its other queues: rec[5]). Its entry (in q's outbox) goes here:
    -- the step that follows writes its own.
    if type(rec[4]) == 'string' then
      rcall('ZREM', k_outbox(q), rec[4])
      rcall('DEL', k_handoff(q, rec[4]))
    end
    local mk = rec[5] and flow_ops.ending(q, f) or k_flow(fq, f)
    if rcall('HEXISTS', mk, 'E') == 0 then return 0 end
    -- One write per done set for the chunk (nothing after it in this call reads them
    -- before flush_counts writes them).
    batch_zsets(true)
    if type(rec[6]) ~= 'string' then
      flow_ops.end_step(mk, q, fq, f, flow_ops.END_CHUNK, now, rec[5] and q)
      return 1
    end
    -- A step of an end a purge began (of queue rec[6], states rec[7]): the purge's
    -- jobs it reaches are deleted, as in the purge's own call; answers {1, how many}.
    purging = {q = rec[6], n = 0, states = {}, letters = rec[7], spent = 0,
      budget = flow_ops.END_CHUNK}
    for letter in string.gmatch(rec[7] or '', '%a') do purging.states[letter] = true end
    flow_ops.end_step(mk, q, fq, f, flow_ops.END_CHUNK, now, rec[5] and q)
    local n = purging.n
    purging = nil
    return {1, n}
  elseif kind == 'Y' then
    -- A flow across slots ends (flow_end): its jobs on queue q, marked ended here first.
    local mk = flow_ops.ending(q, f)
    if rcall('EXISTS', mk) == 1 then return 0 end  -- under way (a re-sent entry)
    rcall('HSET', mk, 'E', rec[4], 'Ec', 0, 'Et', tonumber(rec[6]) + tonumber(rec[7]),
      'S', rec[6], 'n', rec[7], 'mq', rec[8], 'sq', rec[9])
    if rec[5] then rcall('HSET', mk, 'Ee', rec[5]) end
    batch_zsets(true)
    flow_ops.end_step(mk, q, fq, f, flow_ops.END_CHUNK, now, q)
    return 1
  elseif kind == 'R' then
    -- A durable run's step ended on another slot (common/runs.lua): at the run's queue.
    return run_settle(fq, f, rec[4], rec[5], rec[6] or nil, rec[7] or nil, now)
  elseif kind == 'r' then
    local k, steps = tonumber(rec[4]), tonumber(rec[5])
    local done = flow_release_at(q, flow_step_id(f, k, steps), fq, f, k, steps, rec[6] == '1',
      rec[7], now, true, q, rec[8] or nil)
    return done and 1 or 0
  end
  local changed = 0
  if kind == 'E' then
    flow_ended[f] = true
    for i = 6, #rec do
      local r = read_hash(q, rec[i], 's')
      if r and (r[1] == 'a' or r[1] == 'w' or r[1] == 's') then changed = 1 end
      flow_end_job(q, rec[i], rec[4], rec[5] or nil, now)
    end
  elseif kind == 'a' then
    local start = tonumber(rec[4])
    for i = 5, #rec do
      local id = rec[i]
      local r = read_hash(q, id, 's', 'fp', 'p', 'fl')
      if r and r[2] and r[4] == f then
        changed = 1
        rcall('HDEL', k_job(q, id), 'fp')
        if i - 4 <= start and r[1] == 's' then
          rcall('ZREM', k_sched(q), id)
          rcall('HDEL', k_job(q, id), 'r')
          rcall('HSET', k_job(q, id), 's', 'w')
          push_waiting(q, sane_prio(r[3]), id, false)
          count(q, 's', -1)
          count(q, 'w', 1)
          work_queues[q] = true
        end
      end
    end
  elseif kind == 'D' then
    for i = 4, #rec do
      local id = rec[i]
      local r = read_hash(q, id, 's', 'fp', 'fl')
      if r and r[1] == 's' and r[2] and r[3] == f then
        changed = 1
        rcall('ZREM', k_sched(q), id)
        rcall('DEL', k_job(q, id))
        count(q, 's', -1)
      end
    end
  end
  return changed
end

-- The flow link of a job about to be deleted (remove, purge): nil for a job of no flow.
-- r[8]: parked (fail.lua's 'pk').
local function flow_link(q, id)
  local r = rpcall('HMGET', k_job(q, id), 'fl', 'fm', 'fs', 'fq', 'fx', 'fS', 'fsq', 'pk')
  if type(r) ~= 'table' or r.err or not r[1] then return nil end
  if not r[4] then r[4] = q end
  r.q, r.id = q, id
  return r
end

-- A job of a flow was deleted (after its key is gone) in state `s`: when it had not
-- finished (or was parked: its flow waited for it), its flow treats it as failed with
-- reason flow_broken, never waits for it.
local function flow_removed(link, s)
  if not link or ((s == 'c' or s == 'f' or s == 'x') and not (s == 'f' and link[8])) then return end
  local now = now_us()
  flow_settle(link[4], link[1], link[2], link[3], 'f', nil,
    failure_record(FLOW_BROKEN_REASON, FLOW_BROKEN_TYPE, FLOW_BROKEN, 0, nil, now), now, link.q, link.id,
    {link[5], link[6], link[7]})
end


-- Failed-job retention deleted parked job `id` of queue `q` (common/bookkeeping.lua's
-- trim; `r`: its fl, fm, fs, fq, fx, fS, fsq and err, read before): its flow, which
-- waited for it, settles it as failed (a member counted once, a step ending the flow)
-- with its own record's reason (schema_mismatch), type and attempt, and a message that
-- says what happened. The embedded twin: Flows.parked_trimmed, the message's text
-- typedq/broker/records.py's parked_trimmed_message (the contract test holds the two
-- to the same text: the main chunk has no local left for a constant).
function flow_ops.trim_parked(q, id, r, now)
  if not r[1] then return end
  local ok, rec = pcall(cmsgpack.unpack, r[8] or '')
  if not ok or type(rec) ~= 'table' then rec = {} end
  local msg = type(rec.message) == 'string' and rec.message or ''
  flow_settle(r[4] or q, r[1], r[2], r[3], 'f', nil,
    failure_record(type(rec.reason) == 'string' and rec.reason or 'schema_mismatch',
      type(rec.error_type) == 'string' and rec.error_type or 'SchemaMismatch',
      'parked job ' .. id .. ' was deleted by failed-job retention before a retry, so '
        .. 'its flow fails; it had failed with: ' .. msg,
      tonumber(rec.attempt) or 0, nil, now),
    now, q, id, {r[5], r[6], r[7]})
end

-- A large fan-out is stored in bounded steps (typedq/broker/redis/staging.py): its
-- members' bodies are staged first (flow_stage.lua: flow_ops.staged, expiring, nothing reads
-- it), then flow_enqueue stores the flow (its record, steps and own job) with the members
-- still staged: the record's `g` is how many are released (0), `go` the order number
-- before member 0's, `gp` their priority, `ge` the flow's enqueue time. flow_ops.release
-- then releases them in order, `limit` per call (flow_open.lua; the reaper's recover.lua
-- finishes a release its client left), each waiting as flow_enqueue would have stored
-- it. The flow's counter `c` counts the unreleased members as not settled, so its fan-in
-- cannot run before the last one is released and settled. A member whose id another job
-- took since it was staged (or whose staged body is gone) settles as failed with reason
-- flow_broken, as a member removed before it ran would.
-- The helpers are fields of flow_ops (common/flows.lua): flow_ops.staged(q, F), the
-- staged members' hash (member index -> body, on the members' queue);
-- flow_ops.releasing(q), the queue's fan-outs whose release is under way ('<fq>|<F>' ->
-- µs of its last step); flow_ops.release, flow_ops.release_due.
function flow_ops.staged(q, f) return k_q(q) .. 'fg:' .. f end
function flow_ops.releasing(q) return k_fixed(q, 'fR') end
-- Release the next `limit` members of flow F (its record on fq, its members on q).
-- Returns how many are still staged (0: released, or the flow has ended and its staged
-- members are dropped).
function flow_ops.release(q, fq, f, limit, now)
  local fk, sk = k_flow(fq, f), flow_ops.staged(q, f)
  local meta = rcall('HMGET', fk, 'g', 'n', 'go', 'gp', 'ge')
  if not meta[1] then
    -- Released already, or the flow ended (cancelled) first: what is staged never runs.
    -- (UNLINK: a large hash is freed off the main thread.)
    rcall('UNLINK', sk)
    rcall('ZREM', flow_ops.releasing(q), fq .. '|' .. f)
    return 0
  end
  local g, n, base, prio, e = tonumber(meta[1]), tonumber(meta[2]), tonumber(meta[3]), meta[4],
    meta[5]
  local to = math.min(n, g + limit)
  if to <= g then return n - g end
  local fields = {}
  for i = g, to - 1 do fields[#fields + 1] = i end
  local bodies = rcall('HMGET', sk, unpack(fields))
  -- Released fields go (the hash shrinks as the release goes, and is gone after the last).
  rcall('HDEL', sk, unpack(fields))
  local ids, lost = {}, {}
  for j = 1, #fields do
    local i, body = fields[j], bodies[j]
    local id = f .. '.m' .. i
    if not body or job_exists(q, id) then
      lost[#lost + 1] = i
    else
      local jk = k_job(q, id)
      if prio ~= '0' then
        rcall('HSET', jk, 'm', body, 'q', q, 'o', base + i + 1, 'e', e, 'p', prio, 's', 'w',
          'fl', f, 'fq', fq, 'fm', i)
      else
        rcall('HSET', jk, 'm', body, 'q', q, 'o', base + i + 1, 'e', e, 's', 'w',
          'fl', f, 'fq', fq, 'fm', i)
      end
      local group, weight = fair_of(body)
      if group then lane_push(q, prio, id, group, weight) else ids[#ids + 1] = id end
    end
  end
  if #ids > 0 then rcall('LPUSH', k_wait(q, prio), unpack(ids)) end
  rcall('ZADD', k_levels(q), level_score(prio), prio)
  count(q, 'w', #fields - #lost)
  work_queues[q] = true
  -- The cursor first: a lost member's settlement below may end the flow (its record).
  if to == n then
    rcall('HDEL', fk, 'g', 'go', 'gp', 'ge')
    rcall('ZREM', flow_ops.releasing(q), fq .. '|' .. f)
  else
    rcall('HSET', fk, 'g', to)
    rcall('ZADD', flow_ops.releasing(q), now, fq .. '|' .. f)
  end
  if #lost > 0 then
    local broken = failure_record(FLOW_BROKEN_REASON, FLOW_BROKEN_TYPE, FLOW_BROKEN, 0, nil, now)
    for _, i in ipairs(lost) do flow_settle(fq, f, i, nil, 'f', nil, broken, now) end
  end
  return n - to
end

-- The reaper: release the next 200 members of one of queue q's fan-outs whose release
-- made no step for 5 s (its client stopped between two steps; its own release calls run
-- within milliseconds of each other).
function flow_ops.release_due(q, now)
  local age, limit = 5000000, 200
  local due = rcall('ZRANGEBYSCORE', flow_ops.releasing(q), '-inf', string.format('%d', now - age),
    'LIMIT', 0, 1)
  for _, entry in ipairs(due) do
    local fq, f = string.match(entry, '^([^|]+)|(.*)$')
    if fq then flow_ops.release(q, fq, f, limit, now) else rcall('ZREM', flow_ops.releasing(q), entry) end
  end
end
