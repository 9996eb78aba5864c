-- common/bookkeeping.lua: Per-call bookkeeping written once at the end of a script (counts, rollups, batched
-- sorted sets), hand-backs in order, failure records, retention, wake-ups, claims.
-- (A part of the shared prelude, in the order of scripts.py's PARTS: README.md.)
-- Per-queue count deltas, written once at the end of a script.
local deltas = {}
local function count(q, state, d)
  local m = deltas[q]
  if not m then m = {}; deltas[q] = m end
  m[state] = (m[state] or 0) + d
end
-- Per-queue rollup deltas (completed/failed/retried), written once per queue at the end
-- of a script, like the count deltas.
local rollups = {}
local minute_text = {}  --@keep
local function roll(q, field)
  local m = rollups[q]
  if not m then m = {}; rollups[q] = m end
  m[field] = (m[field] or 0) + 1
end
local function flush_rollups()
  if next(rollups) == nil then return end
  -- The minute of the script's own clock reading (one TIME call fewer per script), as
  -- text made once per minute (kept across calls: a number's text, nothing else).
  local n = math.floor((last_now or now_us()) / 60000000)
  if minute_text.n ~= n then minute_text.n, minute_text.t = n, string.format('%d', n) end
  local minute = minute_text.t
  for q, m in pairs(rollups) do
    local hk = k_minute(q, minute)
    local fresh = false
    -- A counter that equals its delta was just made (counters only grow): the hash may
    -- be new, so it gets its TTL. Every hash is made with one of its counters, and the
    -- minute's writes all fall within that minute: one EXPIRE per counter and minute
    -- instead of one per call (the TTL counts from the first write, not the last).
    for f, d in pairs(m) do
      if rcall('HINCRBY', hk, f, num_text(d)) == d then fresh = true end
    end
    if fresh then rcall('EXPIRE', hk, ROLLUP_TTL_S) end
  end
  rollups = {}
end
-- A batch of completions (complete_one) writes the active and done sorted sets once per
-- key, at the end (flush_zsets), instead of one ZREM and one ZADD per job: a command
-- costs a script more than the members it adds. Nothing a completion runs reads these
-- sets; trim and flush_counts write them first. zbatch (batch_zsets(true), by a script
-- that completes more than one job, for the rest of its call): complete_one and finalize
-- defer, into active_rems (active set key -> ids) and done_adds (done set key -> score,
-- id, score, id, ...). Made per call only when used: a one-job call pays nothing.
local zbatch, active_rems, done_adds
local function batch_zsets(on)
  zbatch = on
  if on and not active_rems then active_rems, done_adds = {}, {} end
end
local function flush_zsets()
  if not zbatch then return end
  for key, ids in pairs(active_rems) do
    for s = 1, #ids, 500 do rcall('ZREM', key, unpack(ids, s, math.min(s + 499, #ids))) end
  end
  for key, m in pairs(done_adds) do
    for s = 1, #m, 1000 do rcall('ZADD', key, unpack(m, s, math.min(s + 999, #m))) end
  end
  active_rems, done_adds = {}, {}
end
local function flush_counts()
  flush_zsets()
  flush_rollups()
  for q, m in pairs(deltas) do
    for s, d in pairs(m) do
      -- Never below zero, even after bytes that typedq did not write were dropped.
      if d ~= 0 and rcall('HINCRBY', k_counts(q), s, num_text(d)) < 0 then
        rcall('HSET', k_counts(q), s, '0')
      end
    end
  end
end

-- `fk`: the job hash's fair key ('<weight>|<task>|<key>', set when a claim took it from
-- its key's lane; typedq.fair): the job waits again in that lane, at its tail (a retry),
-- and a key that had no job waiting joins its level's line (lanes.lua lane_push).
local function push_waiting(q, prio, id, at_head, fk)
  if fk and not at_head then
    local w, g = string.match(fk, '^(%d+)|(.+)$')
    if g then
      lane_push(q, prio, id, g, w, true)
      return
    end
  end
  local lk = k_wait(q, prio)
  if at_head then rcall('RPUSH', lk, id) else rcall('LPUSH', lk, id) end
  rcall('ZADD', k_levels(q), level_score(prio), prio)
end

-- How many entries at the head of a level list a hand-back looks at to find its
-- jobs' old places (bounded work; past it they go behind the entries looked at).
local PLACE_SCAN = 64

-- Jobs handed back with their old place (release, stall recovery, a gate giving parked
-- jobs back): each goes back among the waiting jobs of its level by its enqueue order
-- `o`, as if it had never left, also when jobs come back one call at a time. Handed-back
-- jobs are usually older than every waiting job, so their place is at or near the head:
-- the script pops at most PLACE_SCAN head entries, merges the jobs in by order and pushes
-- the lot back. Entries that are not live here (stale or dead) stay in front of the
-- live ones, in their own order, so a stale entry still precedes its id's live one; a
-- waiting entry that is not live is dropped (it has no stale count to consume). Among
-- fair keys' markers (typedq.fair) a job goes right behind the last live entry older
-- than it, or first when there is none: ahead of every marker from there on (each went
-- to the tail after the job was claimed from the head, or is one it was ahead of), and
-- the markers keep their places among the entries (memory/lines.py Level.place_back).
-- back: {id, queue, prio, order, fk} per job; fk (the job hash's fair key, see
-- push_waiting; nil for any other job): the job keeps its *key's* place instead. It
-- goes first in its key's lane (the jobs of one call oldest first, ahead of the key's
-- other jobs: it was the key's oldest when a turn took it) and the key's marker does
-- not move; a key with no job waiting joins the line at the tail (lane_push), where a
-- key whose turn just ended goes. So a hand-back neither moves a key ahead of the other
-- keys nor costs it its next turn: the job is what that turn takes. The embedded
-- broker does the same (memory/lines.py WaitLine.hand_back; docs/flow-control.md).
local function push_back_in_order(back)
  local levels = {}
  -- The fair jobs by lane; lanes in the order their first job comes here.
  local lanes, lane_list = {}, {}
  for i, b in ipairs(back) do
    local w, fg
    if b[5] then w, fg = string.match(b[5], '^(%d+)|(.+)$') end
    if fg then
      local lk = k_lane(b[2], fg, b[3])
      local l = lanes[lk]
      if not l then
        l = {lk = lk, q = b[2], prio = b[3], w = w, g = fg, jobs = {}}
        lanes[lk] = l
        lane_list[#lane_list + 1] = l
      end
      l.jobs[#l.jobs + 1] = {b[1], b[4], i}
    else
      local lk = k_wait(b[2], b[3])
      local g = levels[lk]
      if not g then
        g = {q = b[2], prio = b[3], items = {}}
        levels[lk] = g
      end
      g.items[#g.items + 1] = {b[1], b[4], false, i}
    end
  end
  -- Oldest first; on equal order (garbage), in the call's order.
  local function older(x, y)
    if x[2] ~= y[2] then return x[2] < y[2] end
    return x[#x] < y[#y]
  end
  if #lane_list > 0 then
    for _, l in ipairs(lane_list) do table.sort(l.jobs, older) end
    -- Keys joining the line join it in their oldest job's order.
    table.sort(lane_list, function(x, y) return older(x.jobs[1], y.jobs[1]) end)
    for _, l in ipairs(lane_list) do
      local ids = {}
      for i = #l.jobs, 1, -1 do ids[#ids + 1] = l.jobs[i][1] end  -- the oldest pushed last: first out
      if rcall('RPUSH', l.lk, unpack(ids)) == #ids then
        -- The key had no job waiting: it joins the line at the tail, with its oldest
        -- job's own weight (lane_push's `again`; the embedded broker's join). A key
        -- with jobs waiting keeps its weight: a hand-back is no new job.
        local r = read_keyed(l.q, l.jobs[1][1], 'm')
        local _, w = fair_of(r and r[1])
        w = w or l.w
        rcall('LPUSH', k_wait(l.q, l.prio), '~0|' .. w .. '|' .. l.g)
        rcall('ZADD', k_levels(l.q), level_score(l.prio), l.prio)
        rcall('HSET', k_lanes(l.q), l.prio .. '|' .. l.g, w)
      end
    end
  end
  for lk, g in pairs(levels) do
    -- seq: the live entries and markers popped, head first ({entry, order}; a marker's
    -- order is false).
    local dead, seq, marked = {}, {}, false
    local popped = rcall('RPOP', lk, PLACE_SCAN)
    if popped then
      local sk = k_stale(g.q)
      local has_stale = rcall('EXISTS', sk) == 1
      local seen = {}
      for _, id in ipairs(popped) do
        if string.byte(id, 1) == 126 then
          seq[#seq + 1] = {id, false}  -- a fair key's marker (lanes.lua)
          marked = true
        elseif not is_bare(id) then
          local f = parse_entry(id)
          if f and entry_live(g.q, g.prio, f) then seq[#seq + 1] = {id, tonumber(f.o)} end
        else
          local stale = 0
          if has_stale then stale = tonumber(rcall('HGET', sk, g.prio .. '|' .. id)) or 0 end
          seen[id] = (seen[id] or 0) + 1
          local r = read_keyed(g.q, id, 's', 'q', 'p', 'o')
          if seen[id] <= stale or not r or r[1] ~= 'w' or (r[2] and r[2] ~= g.q)
              or sane_prio(r[3]) ~= g.prio then
            dead[#dead + 1] = id
          else
            seq[#seq + 1] = {id, tonumber(r[4]) or 0}
          end
        end
      end
    end
    local items = g.items
    table.sort(items, older)
    if marked then
      -- Among markers: each job right behind the last live entry older than it.
      for _, item in ipairs(items) do
        local at = 0
        for j, e in ipairs(seq) do
          if e[2] and e[2] < item[2] then at = j end
        end
        table.insert(seq, at + 1, {item[1], item[2]})
      end
    else
      -- No marker: the live entries and the jobs by order; on equal order (garbage),
      -- entries that were in the list first.
      for j, e in ipairs(seq) do seq[j] = {e[1], e[2], true, j} end
      for _, item in ipairs(items) do seq[#seq + 1] = item end
      table.sort(seq, function(x, y)
        if x[2] ~= y[2] then return x[2] < y[2] end
        if x[3] ~= y[3] then return x[3] end
        return x[4] < y[4]
      end)
    end
    -- RPUSH adds at the head: push the last first, so the first ends up first out;
    -- the dead entries go last (first out), in the order they were popped.
    for i = #seq, 1, -1 do rcall('RPUSH', lk, seq[i][1]) end
    for i = #dead, 1, -1 do rcall('RPUSH', lk, dead[i]) end
    rcall('ZADD', k_levels(g.q), -tonumber(g.prio), g.prio)
  end
end

-- The answer of a fenced finish for a job that has no job hash: a job that exists but
-- was never claimed (still a job string) is not ours to finish (LEASE_LOST, as for
-- any job that is not active under the token); no job at all is NOT_FOUND.
local function not_active_answer(q, id)
  if job_exists(q, id) then return 2 end
  return 3
end

-- A FailureRecord (typedq.errors) as msgpack: a map with the struct's field names.
-- The same records and messages as typedq/broker/records.py builds for the memory
-- broker (tests/test_failure_records.py holds the two to the same fields).
local function failure_record(reason, error_type, message, attempt, worker, now)
  local rec = {
    reason = reason, error_type = error_type, message = message,
    attempt = attempt, retryable = false, failed_at = now / 1000000,
  }
  if worker then rec.worker_id = worker end
  return cmsgpack.pack(rec)
end

-- Helpers of workflows that the hot paths do not call, as fields of one table made at
-- load (the library's main chunk holds at most 200 locals: a local per helper would use
-- them up): flow_ops.outbox_due (common/flows.lua), the staging of large fan-outs and
-- flow_ops.trim_parked, which trim below calls (common/flow_settle.lua).
local flow_ops = {}  --@keep

-- Retention: drop the oldest finished jobs of one state of queue `q` while there are
-- more than `cap` or they are older than `ttl`; at most `budget` per call (bounded work).
-- A parked job (fail.lua's 'pk': its flow waits for an operator retry) goes as any
-- failed one, and its flow then fails (flow_ops.trim_parked): after the trim's own deletions,
-- so a flow's end that fails more jobs of the queue leaves them to the next trim.
local function trim(q, state, now, ttl, cap, budget)
  flush_zsets()
  local zkey = k_done(q, state)
  local over = rcall('ZCARD', zkey) - cap
  local expired = rcall('ZCOUNT', zkey, '-inf', '(' .. string.format('%d', now - ttl))
  local n = math.max(over, expired)
  if n <= 0 then return 0 end
  if n > budget then n = budget end
  local popped = rcall('ZPOPMIN', zkey, n)
  -- The jobs still in this state are deleted by one DEL per 500 (a command costs a
  -- script more than the key it deletes): at the cap, every completion deletes one.
  -- Only a failed job can be parked: retry and cancel, the ways out of 'f' to another
  -- final state, delete its 'pk' (a field a hash lacks costs HMGET a scan of it).
  local parked, gone, trimmed = nil, {}, 0
  local want_pk = state == 'f'
  for i = 1, #popped, 2 do
    local jk = k_job(q, popped[i])
    -- (read_hash's read, on the key made here: a pcall, so a key of another type is
    -- skipped, never an error)
    local r
    if want_pk then r = rpcall('HMGET', jk, 's', 'pk') else r = rpcall('HMGET', jk, 's') end
    if type(r) == 'table' and not r.err and r[1] == state then
      if r[2] then
        parked = parked or {}
        parked[#parked + 1] = {popped[i], rcall('HMGET', jk, 'fl', 'fm',
          'fs', 'fq', 'fx', 'fS', 'fsq', 'err')}
      end
      trimmed = trimmed + 1
      gone[trimmed] = jk
    end
  end
  for s = 1, trimmed, 500 do rcall('DEL', unpack(gone, s, math.min(s + 499, trimmed))) end
  if trimmed > 0 then
    count(q, state, -trimmed)
    count(q, 't' .. state, trimmed)  -- trimmed by retention (queue_stats' trimmed counts)
  end
  if parked then
    for _, p in ipairs(parked) do flow_ops.trim_parked(q, p[1], p[2], now) end
  end
  return n
end

local done_ids = {}
local work_queues = {}
local function note_done(q, id) done_ids[#done_ids + 1] = id end
local function publish_cancel(q, id) rcall('PUBLISH', CH_CANCEL, id) end
-- Is a durable run on queue `rq` out of reach of a script on queue `q`'s slot? Never on
-- one Redis (a script may touch any key); on Redis Cluster (sharded.lua) whenever the
-- queues differ: a step's outcome then travels through the outbox (common/runs.lua).
local function run_away(q, rq) return false end
-- The hand-off registrations of queue `q` end (work came to it another way than a
-- hand-off: stored where claims find it): each registered worker finds '' in its
-- inbox and claims. A registration is always made with its queues' waiter marks
-- (handoff.lua), so publish, which consumes a mark, looks here only then.
local function wake_handoffs(q)
  local hk = k_fixed(q, 'H')
  local regs = rcall('HGETALL', hk)
  if #regs == 0 then return end
  rcall('DEL', hk)
  for i = 1, #regs, 2 do
    local inbox = k_q(regs[i + 1]) .. 'I:' .. regs[i]
    local v = rcall('GET', inbox .. ':c')
    if v then
      rcall('DEL', inbox .. ':c')
      rcall('LPUSH', inbox, '')
      rcall('PEXPIRE', inbox, tonumber(string.match(v, '^%d+|%d+|(%d+)|')) or REQ_TTL_MS)
    end
  end
end
-- The work notice names only the queues whose waiter mark this call consumed: a
-- worker waits for work only after a claim that came up short, and that claim set the
-- mark in the same script that found nothing more to claim, so any later call giving
-- the queue work finds the mark (no lost wake-up). One notice wakes every waiter of the
-- queue (broadcast); calls after it publish nothing until a claim comes up short again.
local function publish()
  if #done_ids > 0 then rcall('PUBLISH', CH_DONE, table.concat(done_ids, ' ')) end
  if next(work_queues) == nil then return end  -- (no table for a call that woke nothing)
  local qs = nil
  for q in pairs(work_queues) do
    if rcall('DEL', k_waiter(q)) == 1 then
      qs = qs or {}
      qs[#qs + 1] = q
      wake_handoffs(q)
    end
  end
  if qs then rcall('PUBLISH', CH_WORK, table.concat(qs, ' ')) end
end
-- The waiter marks of the queues args[first .. last] (a claim that came up short: see
-- publish and claim.lua).
local function mark_waiters(args, first, last)
  for i = first, last do rcall('SET', k_waiter(args[i]), '1') end
end

-- The bookkeeping of job `id` of queue `q` that a claim took (common/claiming.lua's activate, the
-- same for a waiting entry as for a job with a key): its lease until `lease_until` (text)
-- queued in `leases` (queue -> lease_until, id, ...: one ZADD per queue at the end of a
-- claim of several jobs, which also counts them there: waiting -n / active +n) or added
-- now (nil: a claim of one) and counted, waiting -1 / active +1, and its claim record
-- line '<queue>|<id>' (`bare`, a claim of one queue: '<id>', that queue's; no string
-- made per job), appended to `lines` (nil: a claim of one, which keeps the line
-- itself, no table) and returned.
local function claimed_job(q, id, lease_until, leases, lines, bare)
  if leases then
    local m = leases[q]
    if not m then m = {}; leases[q] = m end
    m[#m + 1], m[#m + 2] = lease_until, id
  else
    rcall('ZADD', k_active(q), lease_until, id)
    count(q, 'w', -1)
    count(q, 'a', 1)
  end
  local line = id
  if not bare then line = q .. '|' .. id end
  if lines then lines[#lines + 1] = line end
  return line
end

-- Direct hand-off (issue 31): jobs `ids[first..last]` (orders `orders`, bodies
-- `bodies`, all of level `prio`), just enqueued into queue `q` where nothing else
-- waits, go straight to idle workers registered in `q` (handoff.lua): each such job
-- is claimed here, as common/claiming.lua's activate claims a waiting entry, under the lease and
-- worker of its registration and the token '<registration>.<id>', and pushed to the
-- registration's inbox as '<id>|<token>|<enqueued_at>|<queue>|<body>', where the
-- worker's blocking pop takes it: one hop from enqueue to worker, no claim. A
-- registration takes at most its free slots; one whose slots are all taken ends.
-- `now` (µs, and its text `now_text`): the enqueue's clock. Returns how many jobs of
-- ids[first..] were handed (the first ones, in order); their index fields are deleted
-- here, from the buckets `iks` names (ids[j]'s at iks[j]; nil: each found by hashing
-- its id; false: none, the caller wrote no index field for them: enqueue.lua).
local function hand_off(q, prio, ids, orders, bodies, first, last, now, now_text, iks)
  local hk = k_fixed(q, 'H')
  local regs = rcall('HGETALL', hk)
  if #regs == 0 or rcall('EXISTS', k_gates(q)) == 1 then return 0 end
  local at = first
  for i = 1, #regs, 2 do
    if at > last then break end
    local tok, home = regs[i], regs[i + 1]
    local inbox = k_q(home) .. 'I:' .. tok
    local v = rcall('GET', inbox .. ':c')
    local slots, lease, ttl, worker
    if v then slots, lease, ttl, worker = string.match(v, '^(%d+)|(%d+)|(%d+)|(.*)$') end
    slots = tonumber(slots)
    if not slots or slots < 1 then
      rcall('HDEL', hk, tok)  -- ended (another queue's hand-off, or it expired)
    else
      local take = math.min(slots, last - at + 1)
      local lease_until = num_text(now + tonumber(lease))
      local items, lines, leases = {}, {}, {}
      for k = 1, take do
        local j = at + k - 1
        local id, o, m = ids[j], orders[j], bodies[j]
        local jt = tok .. '.' .. id
        if iks ~= false then rcall('HDEL', iks and iks[j] or k_idx(q, id), id) end
        if prio == '0' then
          rcall('HSET', k_job(q, id), 'm', m, 'q', q, 's', 'a', 'o', o, 'e', now_text,
            'a', '1', 't', jt, 'st', now_text, 'w', worker)
        else
          rcall('HSET', k_job(q, id), 'm', m, 'q', q, 's', 'a', 'o', o, 'e', now_text,
            'a', '1', 't', jt, 'st', now_text, 'w', worker, 'p', prio)
        end
        leases[2 * k - 1], leases[2 * k] = lease_until, id
        items[k] = id .. '|' .. jt .. '|' .. now_text .. '|' .. q .. '|' .. m
        lines[k] = q .. '|' .. id
      end
      for s = 1, take, 500 do
        local e = math.min(s + 499, take)
        rcall('ZADD', k_active(q), unpack(leases, 2 * s - 1, 2 * e))
        rcall('LPUSH', inbox, unpack(items, s, e))
        rcall('RPUSH', inbox .. ':h', unpack(lines, s, e))
      end
      rcall('PEXPIRE', inbox, ttl)
      rcall('PEXPIRE', inbox .. ':h', ttl)
      if take == slots then
        rcall('DEL', inbox .. ':c')
        rcall('HDEL', hk, tok)
      else
        rcall('SET', inbox .. ':c', (slots - take) .. '|' .. lease .. '|' .. ttl .. '|' .. worker,
          'KEEPTTL')
      end
      at = at + take
    end
  end
  local handed = at - first
  if handed > 0 then count(q, 'a', handed) end
  return handed
end
