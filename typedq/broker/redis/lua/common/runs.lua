-- common/runs.lua: Durable runs (typedq/broker/runs.py; the embedded broker's
-- typedq/broker/memory/runs.py is the reference): a run's record, its turns, its steps'
-- outcomes, its end and the retention of ended runs. Keys: keys.py (Q u:<run> ...).
-- (A part of the shared prelude, in the order of scripts.py's PARTS: README.md.)

-- The retention of ended runs, as the calling script was given it (run_bounds): per
-- final state letter {ttl µs, cap}. Unset in scripts that end no run and read none.
local run_keep = {}
-- The ids of the runs this call deleted (retention): the caller drops them from the
-- app's run index (P runs, on another slot on Redis Cluster).
local run_gone = {}

-- Take the retention from a script's arguments: completed ttl (µs), cap, failed ttl, cap.
local function run_bounds(cttl, ccap, fttl, fcap)
  run_keep.c = {tonumber(cttl), tonumber(ccap)}
  run_keep.f = {tonumber(fttl), tonumber(fcap)}
  run_keep.x = run_keep.f
end

-- Delete every key of run `r` of queue `q`.
local function run_forget(q, r)
  local sk = k_run_signals(q, r)
  for _, s in ipairs(rcall('SMEMBERS', sk)) do rcall('DEL', k_run_inbox(q, r, s)) end
  rcall('DEL', k_run(q, r), k_run_log(q, r), k_run_outcomes(q, r), sk)
  run_gone[#run_gone + 1] = r
end

-- Drop the ended runs of state `st` of queue `q` past the count bound, and (at most
-- 100 per call) past the age bound, oldest first.
local function run_trim(q, st, now)
  local keep = run_keep[st]
  if not keep then return end
  local dk = k_run_done(q, st)
  local over = rcall('ZCARD', dk) - keep[2]
  if over > 0 then
    for _, r in ipairs(rcall('ZRANGE', dk, 0, over - 1)) do run_forget(q, r) end
    rcall('ZREMRANGEBYRANK', dk, 0, over - 1)
  end
  local old = rcall('ZRANGEBYSCORE', dk, '-inf', string.format('%d', now - keep[1]),
    'LIMIT', 0, 100)
  for _, r in ipairs(old) do
    run_forget(q, r)
    rcall('ZREM', dk, r)
  end
end

-- The state letter of run `r` of queue `q` (false: no such run). An ended run past its
-- age bound is gone (deleted here), as the embedded broker's retention would have it.
local function run_state(q, r, now)
  local m = rcall('HMGET', k_run(q, r), 'st', 'fa')
  if not m[1] then return false end
  local keep = m[1] ~= 'r' and run_keep[m[1]]
  if keep and tonumber(m[2]) <= now - keep[1] then
    run_forget(q, r)
    rcall('ZREM', k_run_done(q, m[1]), r)
    return false
  end
  return m[1]
end

-- Store turn job `id` of queue `q` with body `body`: waiting, or scheduled at `at` (µs)
-- when that is later than `now`. An id taken already (a run made again under the id of
-- one retention dropped, whose turn job is still kept) stores nothing.
local function run_enqueue(q, id, body, at, now)
  if job_exists(q, id) then return end
  local o = rcall('INCR', k_seq(q))
  if at > now then
    rcall('SET', k_job(q, id), pack_rec({s = 's', q = q, o = o, e = now, p = false, r = at,
      m = body}))
    rcall('ZADD', k_sched(q), string.format('%d', at), id)
    count(q, 's', 1)
  else
    push_entry(q, '0', id, o, now, body)
    count(q, 'w', 1)
  end
  work_queues[q] = true
end

-- Enqueue a turn of run `r` of queue `q`: now (`at` at or before `now`) or at `at` (µs).
-- At most one immediate turn waits at a time: while the last one is still waiting,
-- another immediate one is not enqueued.
local function run_wake(q, r, at, now)
  local rk = k_run(q, r)
  local immediate = at <= now
  if immediate then
    local t = rcall('HGET', rk, 't')
    if t then
      local s = read_job(q, t, 's')
      if s and s[1] == 'w' then return end
    end
  end
  local id = r .. ':t' .. rcall('HINCRBY', rk, 'n', 1)
  run_enqueue(q, id, rcall('HGET', rk, 'tb'), immediate and 0 or at, now)
  if immediate then rcall('HSET', rk, 't', id) end
end

-- End run `r` of queue `q` in state `st` ('c', 'f', 'x') with result `res` or failure
-- `err`: its waits and kept outcomes go, it joins the queue's ended runs (retention).
local function run_finish(q, r, st, res, err, now)
  local rk = k_run(q, r)
  rcall('HDEL', rk, 'wj', 'ws', 'wa')
  local t = {'st', st, 'fa', string.format('%d', now)}
  if res then t[#t + 1] = 'res'; t[#t + 1] = res end
  if err then t[#t + 1] = 'err'; t[#t + 1] = err end
  rcall('HSET', rk, unpack(t))
  rcall('DEL', k_run_outcomes(q, r))
  rcall('ZADD', k_run_done(q, st), string.format('%d', now), r)
  run_trim(q, st, now)
end

-- Is job `id` among the space-separated ids `list`?
local function run_lists(list, id)
  return list and string.find(' ' .. list .. ' ', ' ' .. id .. ' ', 1, true) ~= nil
end

-- Step `id` of run `r` (on queue rq, this script's slot) ended in state `state`: keep
-- its outcome while the run is running, and wake the run when it waits on the step.
-- 1 when the run took it, 0 when there is no such run, it has ended or recorded it.
run_settle = function(rq, r, id, state, res, err, now)
  local rk = k_run(rq, r)
  local m = rcall('HMGET', rk, 'st', 'wj')
  if m[1] ~= 'r' then return 0 end
  local ok = k_run_outcomes(rq, r)
  -- '' marks an outcome an append recorded already (a hand-off applied late or twice).
  if rcall('HGET', ok, id) == '' then return 0 end
  local v = state
  if state == 'c' then v = v .. (res or '') elseif err then v = v .. err end
  rcall('HSET', ok, id, v)
  if run_lists(m[2], id) then run_wake(rq, r, 0, now) end
  return 1
end

-- The run queue a job body names (its 14th and last field, run_queue: a fixarray of 14
-- fields, ending with the name as a msgpack str), or nil. Read from the end (cmsgpack
-- reads no bin, and the payload may be long): a queue name is ASCII, so the first byte
-- from the end at or above 0x80 is the str's header (fixstr), or str8's 0xd9 just
-- before its length byte (queue names: keys.py, at most 128 characters).
local function body_run_queue(m)
  if string.byte(m, 1) ~= 0x9e then return nil end
  local n = #m
  for i = n, math.max(2, n - 300), -1 do
    local b = string.byte(m, i)
    if b >= 0x80 then
      if b >= 0xa0 and b <= 0xbf and b - 0xa0 == n - i and i < n then
        return string.sub(m, i + 1)
      end
      if b == 0xd9 and string.byte(m, i + 1) == n - i - 1 then return string.sub(m, i + 2) end
      -- (a name of 128 characters: str8's length byte is 0x80)
      if b == n - i and string.byte(m, i - 1) == 0xd9 then return string.sub(m, i + 1) end
      return nil
    end
  end
  return nil
end

-- Job `id` of queue `q` (its hash `jk`) reached final state `state`, and its id ends in
-- ':<digits>': a durable run's step when its body's run_queue names the run's queue.
-- The run is told here, or through the outbox when it is on another slot.
run_step_done = function(q, id, jk, state, now)
  local f = rcall('HMGET', jk, 'm', 'res', 'err')
  local rq = f[1] and body_run_queue(f[1])
  if not rq then return end
  local r = string.match(id, '^(.+):%d+$')
  if run_away(q, rq) then
    flow_outbox(q, rq, id .. '|u', {'R', r, rq, id, state, f[2] or false, f[3] or false})
  else
    run_settle(rq, r, id, state, f[2] or nil, f[3] or nil, now)
  end
end

-- Run `r` of queue `q` as a reply: {spec, state, created_at, finished_at, result,
-- failure, wait_jobs, wait_signal, wake_at, log, inbox {name, payloads...}, outcomes
-- {id, value, ...}} (false for what it has not).
local function run_reply(q, r)
  local m = rcall('HMGET', k_run(q, r), 'sp', 'st', 'ca', 'fa', 'res', 'err', 'wj', 'ws', 'wa')
  local inbox = {}
  for _, s in ipairs(rcall('SMEMBERS', k_run_signals(q, r))) do
    local got = rcall('LRANGE', k_run_inbox(q, r, s), 0, -1)
    if #got > 0 then inbox[#inbox + 1] = {s, got} end
  end
  return {m[1], m[2], m[3], m[4] or '0', m[5], m[6], m[7], m[8], m[9],
    rcall('LRANGE', k_run_log(q, r), 0, -1), inbox, rcall('HGETALL', k_run_outcomes(q, r))}
end

-- A run script's reply: its answers and the runs retention dropped.
local function run_answer(out)
  flush_counts()
  publish()
  return {out, run_gone}
end
