-- common/finish.lua: Final states: flow links, events, finalize, concurrency slots, complete_one,
-- request records, stale entries.
-- (A part of the shared prelude, in the order of scripts.py's PARTS: README.md.)

-- A job of a workflow settled: hand off or end the flow (defined with the workflow
-- helpers in common/flow_settle.lua).
local flow_settle
-- A job whose id ends in ':<digits>' reached a final state: when its body names a durable
-- run's queue (a step, see common/runs.lua), keep its outcome with the run and wake it;
-- a run's turn (':t<digits>') that failed for good fails its run.
local run_step_done
-- A durable run's step ended (its outcome, on the run's slot): common/runs.lua.
local run_settle
-- string.find, read once per call (finalize_after looks at every finished job's id).
local find = string.find
-- Per job key, its flow link {fl, fm, fs, fq} or false, when the script already read
-- it (complete and fail do, with the fields they read anyway): finalize then needs no
-- read of its own; true: a job of a flow whose link finalize reads with its outcome
-- (complete reads only 'fl', so a job of no flow pays no lookup of absent fields). `fq`
-- is the queue of the flow's own job (where the flow record is; absent on jobs of the
-- previous layout: the job's own queue).
local flow_links = {}
local function flow_link_of(q, id, fl, fm, fs, fq)
  if fl then flow_links[k_job(q, id)] = {fl, fm, fs, fq or q} else flow_links[k_job(q, id)] = false end
end

-- Move an active/waiting/scheduled job to a final state. A workflow's job (fields
-- fl/fm/fs, see typedq/broker/flow.py) hands off to the rest of its flow here, in the
-- same script as its own transition.
-- The task name at the head of a job body ([task, payload, ...], msgpack): a fixstr or
-- str8 right after the array header; '' for anything else (a pre-body record).
local function body_task(m)
  if not m then return '' end
  local b = string.byte(m, 2)
  if b and b >= 0xa0 and b <= 0xbf then return string.sub(m, 3, 2 + b - 0xa0) end
  if b == 0xd9 then return string.sub(m, 4, 3 + (string.byte(m, 3) or 0)) end
  return ''
end

-- Job `id` of queue `q` reached final state `state`: when the queue's event stream is
-- on, add its event '<n>-1' (n: the queue's next event number), capped near its 'cap'.
-- One HGET per queue per call when it is off.
-- The same read says whether some job of the queue held a unique key (field 'u', set
-- by enqueue_controlled.lua): only then does finalize look for the key a job holds.
local events_cap = {}
local unique_on = {}
local function emit_event(id, q, state)
  local cap = events_cap[q]
  if cap == nil then
    local c = rcall('HMGET', k_events_cfg(q), 'cap', 'u')
    cap = tonumber(c[1]) or false
    events_cap[q] = cap
    -- Only a queue with unique jobs is noted: the table stays empty (nothing to make
    -- again for the next call) in the usual case.
    if c[2] then unique_on[q] = true end
  end
  if not cap then return end
  local r = rcall('HMGET', k_job(q, id), 'm', 'res', 'err', 'a')
  local data = r[3]
  if state == 'c' then data = r[2] end
  local n = rcall('HINCRBY', k_events_cfg(q), 'n', 1)
  -- pcall: an entry id at or below the stream's last (its config was deleted and made
  -- again) loses that event rather than aborting the transition half done.
  rpcall('XADD', k_events(q), 'MAXLEN', '~', cap, n .. '-1', 'i', id, 'k',
    body_task(r[1]), 's', state, 'd', data or '', 'a', r[4] or '0')
end

-- Job `id` of queue `q`, which may hold a unique key, reached final `state`: a completed
-- job keeps its key for its window (its marker expires then, even if retention deletes
-- the job sooner), a failed or cancelled one frees it at once (memory/control.py).
local function release_unique(q, id, state)
  local hk = k_unique_job(q, id)
  local v = rcall('GET', hk)
  if not v then return end
  rcall('DEL', hk)
  local window, marker = string.match(v, '^(%d+)|(.+)$')
  if not window then return end
  local mk = k_unique(q, marker)
  if rcall('GET', mk) ~= id then return end
  if state == 'c' then rcall('PEXPIRE', mk, window) else rcall('DEL', mk) end
end

-- The rest of a job's move to a final state, once its hash holds the state (finalize,
-- complete_one): into the done set (`at`: the finish time's text), counts, rollup,
-- wake-up, event, its flow. `fl`: what the script knows of its flow link (as
-- flow_links holds it; nil: not read yet).
local function finalize_after(id, q, jk, from, state, now, at, fl)
  local done_key = k_done(q, state)
  if zbatch then
    local m = done_adds[done_key]
    if not m then m = {}; done_adds[done_key] = m end
    m[#m + 1], m[#m + 2] = at, id
  else
    rcall('ZADD', done_key, at, id)
  end
  count(q, from, -1)
  count(q, state, 1)
  if state == 'c' or state == 'f' then roll(q, state) end
  note_done(q, id)
  emit_event(id, q, state)
  -- A durable run's step has an id '<run id>:<position>': for every other job a plain
  -- search for ':' (most ids have none; then a pattern match), no command.
  if find(id, ':', 1, true) then
    if find(id, ':%d+$') then
      run_step_done(q, id, jk, state, now)
    elseif state == 'f' and find(id, ':t%d+$') then
      run_step_done(q, id, jk, state, now, true)  -- a run's turn failed for good
    end
  end
  if unique_on[q] then release_unique(q, id, state) end
  if fl == true then
    -- A job of a flow whose link was not read yet (complete_one): link and outcome in
    -- one read.
    local r = rcall('HMGET', jk, 'fl', 'fm', 'fs', 'fq', 'res', 'err')
    if r[1] then flow_settle(r[4] or q, r[1], r[2], r[3], state, r[5], r[6], now, q, id) end
    return
  end
  if fl == nil then
    fl = rcall('HMGET', jk, 'fl', 'fm', 'fs', 'fq')
    if not fl[1] then fl = false elseif not fl[4] then fl[4] = q end
  end
  if fl then
    local out = rcall('HMGET', jk, 'res', 'err')
    flow_settle(fl[4], fl[1], fl[2], fl[3], state, out[1], out[2], now, q, id)
  end
end

-- `extra`: more field/value pairs to write with the state (one HSET instead of two);
-- when they set the token 't' (to ''), no HDEL of it follows.
local function finalize(id, q, from, state, now, extra)
  local jk = k_job(q, id)
  local at = num_text(now)
  if extra then
    rcall('HSET', jk, 's', state, 'fa', at, unpack(extra))
  else
    rcall('HSET', jk, 's', state, 'fa', at)
  end
  if not extra or extra[#extra - 1] ~= 't' then rcall('HDEL', jk, 't') end
  finalize_after(id, q, jk, from, state, now, at, flow_links[jk])
end

-- Release the concurrency slot `slot` (the job hash's 'ck', nil: none) that job `id`
-- of queue `q` holds, and open the gate of that key so parked jobs are claimed again.
-- Every way out of 'active' calls it (complete, fail, release, recovery, remove, purge).
local function free_slot(id, q, slot)
  if not slot then return end
  rcall('SREM', k_slots(q, slot), id)
  rcall('HDEL', k_job(q, id), 'ck')
  local gk, gate = k_gates(q), 'c|' .. slot
  local s = rcall('ZSCORE', gk, gate)
  if s and tonumber(s) ~= 0 then
    rcall('ZADD', gk, 0, gate)
    work_queues[q] = true
  end
end

-- The concurrency slot `slot` of an active job `id` that an operator deletes (remove,
-- purge) while its handler may still run: the job's place in the slot set goes to a
-- ghost '~<id>' until the job's lease would have ended (`until_us`: by then its worker,
-- told the lease is lost, has cancelled the handler), and the slot's gate opens then.
-- Ghosts are in the zset '<slot set>:g' by when they end; the claim's count of the slot
-- drops ended ones (common/gates.lua's held). A lease already over frees the slot at once.
local function ghost_slot(id, q, slot, until_us)
  if not slot then return end
  local ends = tonumber(until_us)
  if not ends or ends <= now_us() then return free_slot(id, q, slot) end
  local sk = k_slots(q, slot)
  rcall('SREM', sk, id)
  rcall('SADD', sk, '~' .. id)
  rcall('ZADD', sk .. ':g', until_us, '~' .. id)
  local gk, gate = k_gates(q), 'c|' .. slot
  local s = rcall('ZSCORE', gk, gate)
  if s and tonumber(s) > ends then rcall('ZADD', gk, until_us, gate) end
end

-- Complete job `id` of queue `q` under token `tok` with result `res`, fenced (complete.lua,
-- and a claim that settles its worker's completions first). The outcome: 0 OK,
-- 1 ALREADY_FINISHED (same token: a re-sent request), 2 LEASE_LOST, 3 NOT_FOUND.
local function complete_one(q, id, tok, res, now)
  -- A workflow's other fields (fm, fs, fq) are read only for a job of a flow ('fl'): a
  -- field a hash does not hold costs HMGET a scan of the whole hash. So is the done
  -- token 'd' (absent on an active job), read below only when the job is not ours.
  -- (read_hash's read, on the key made once here: a pcall, so a key of another type is
  -- no job, never an error)
  local jk = k_job(q, id)
  local r = rpcall('HMGET', jk, 's', 't', 'ck', 'fl')
  if type(r) ~= 'table' or r.err or not r[1] then return not_active_answer(q, id) end
  if r[1] == 'a' and r[2] == tok then
    local ak = k_active(q)
    if zbatch then
      local ids = active_rems[ak]
      if not ids then ids = {}; active_rems[ak] = ids end
      ids[#ids + 1] = id
    else
      rcall('ZREM', ak, id)
    end
    if r[3] then free_slot(id, q, r[3]) end
    -- finalize's work, without its table of extra fields: the result and the token go
    -- in the state's HSET, and the token is cleared there too (every reader of 't'
    -- checks the state 'a' first): one HDEL fewer per job.
    local at = num_text(now)
    rcall('HSET', jk, 's', 'c', 'fa', at, 'res', res, 'd', tok, 't', '')
    -- (true: a job of a flow whose link finalize_after reads, with the result it reads
    -- anyway)
    finalize_after(id, q, jk, 'a', 'c', now, at, r[4] and true or false)
    return 0
  end
  -- Not active under this token: finished under it already (a re-sent request: its done
  -- token) or not ours (the lease was lost).
  if rcall('HGET', jk, 'd') == tok then return 1 end
  return 2
end

-- Milliseconds a request record (a claim's jobs, an enqueue's or a cancel's answer)
-- is kept: longer than redis-py's whole retry window, so a re-sent script (lost
-- reply, automatic retry) finds the first copy's answer and returns it.
-- REQ_TTL_MS (generated from the Python value: constants.py).

-- Stale waiting entries. A waiting job that leaves its level list without being
-- popped (cancel, remove) leaves its entry behind (O(1) instead of an O(n) LREM);
-- the entry is counted in the queue's stale hash under '<prio>|<id>'. Stale entries
-- of one id in one level always precede its live entry (a job gets a new entry only
-- while it has none live), so whoever pops an entry with a count consumes one and
-- skips it: a re-used id is claimed where a fresh job would be, never earlier.
-- Per queue: does its stale hash exist (nil: not looked yet)? Most queues have no
-- stale entries at all; then a claim pays one EXISTS, not one HGET per job.
local stale_any = {}
local function mark_stale(q, prio, id)
  -- A fair job (typedq.fair) waiting in its key's lane: its lane entry becomes '|' (a
  -- removed entry: it still counts in its key's turn, as a stale entry does on the
  -- embedded broker, but names no job), so no stale id of it is left where another
  -- list's entry of the same id could be taken for it. Queues without fair lanes pay
  -- one EXISTS.
  if rcall('EXISTS', k_lanes(q)) == 1 then
    local r = read_keyed(q, id, 'm')
    local group = r and fair_of(r[1])
    local lk = group and k_lane(q, group, prio)
    local pos = lk and rcall('LPOS', lk, id)
    if pos then
      rcall('LSET', lk, pos, '|')
      rcall('HDEL', k_parked(q), id)
      return
    end
  end
  rcall('HINCRBY', k_stale(q), prio .. '|' .. id, 1)
  rcall('HDEL', k_parked(q), id)  -- a parked job's gate entry is stale from now on
  stale_any[q] = true
end

local function take_stale(q, prio, id)
  local sk, field = k_stale(q), prio .. '|' .. id
  if stale_any[q] == nil then stale_any[q] = rcall('EXISTS', sk) == 1 end
  if not stale_any[q] then return false end
  local c = tonumber(rcall('HGET', sk, field))
  if not c then return false end
  if c <= 1 then rcall('HDEL', sk, field) else rcall('HINCRBY', sk, field, -1) end
  return true
end

