-- common/flow_handoffs.lua: Workflows: applying hand-offs (outbox records), starting the
-- chunks of a flow across slots, the flows of deleted jobs, releasing staged fan-outs.
-- (A part of the shared prelude, in the order of scripts.py's PARTS: README.md; it uses
-- common/flow_settle.lua's helpers, the part before it.)

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
