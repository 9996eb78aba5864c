-- common/runs.lua: Durable runs (typedq/broker/runs.py; the embedded broker's
-- typedq/broker/memory/runs.py is the reference): a run's record, its turns, its steps'
-- outcomes, its end and the retention of ended runs. Keys: keys.py (Q u:<run> ...).
-- (A part of the shared prelude, in the order of scripts.py's PARTS: README.md.)

-- This call's runs: per final state letter the retention of ended runs, {ttl µs, cap},
-- as the calling script was given it (run_ops.bounds; unset in scripts that end no run and
-- read none); `gone`, the ids of the runs this call deleted (retention), which the
-- caller drops from the app's run index (P runs, on another slot on Redis Cluster).
local run_call = {}
-- The helpers below, as fields of one table made at load (the library's main chunk holds
-- at most 200 locals: a local per helper would use them up).
local run_ops = {}  --@keep

-- Take the retention from a script's arguments: completed ttl (µs), cap, failed ttl, cap.
function run_ops.bounds(cttl, ccap, fttl, fcap)
  run_call.c = {tonumber(cttl), tonumber(ccap)}
  run_call.f = {tonumber(fttl), tonumber(fcap)}
  run_call.x = run_call.f
end

-- Delete every key of run `r` of queue `q`.
function run_ops.forget(q, r)
  local sk = k_run(q, 'uS:', r)
  for _, s in ipairs(rcall('SMEMBERS', sk)) do rcall('DEL', k_run(q, 'us:', r .. '|' .. s)) end
  rcall('DEL', k_run(q, 'u:', r), k_run(q, 'ul:', r), k_run(q, 'uo:', r), sk)
  local gone = run_call.gone
  if not gone then gone = {}; run_call.gone = gone end
  gone[#gone + 1] = r
end

-- Drop the ended runs of state `st` of queue `q` past the count bound, and (at most
-- 100 per call) past the age bound, oldest first.
function run_ops.trim(q, st, now)
  local keep = run_call[st]
  if not keep then return end
  local dk = k_run(q, 'ud:', st)
  local over = rcall('ZCARD', dk) - keep[2]
  if over > 0 then
    for _, r in ipairs(rcall('ZRANGE', dk, 0, over - 1)) do run_ops.forget(q, r) end
    rcall('ZREMRANGEBYRANK', dk, 0, over - 1)
  end
  local old = rcall('ZRANGEBYSCORE', dk, '-inf', string.format('%d', now - keep[1]),
    'LIMIT', 0, 100)
  for _, r in ipairs(old) do
    run_ops.forget(q, r)
    rcall('ZREM', dk, r)
  end
end

-- The state letter of run `r` of queue `q` (false: no such run). An ended run past its
-- age bound is gone (deleted here), as the embedded broker's retention would have it.
function run_ops.state(q, r, now)
  local m = rcall('HMGET', k_run(q, 'u:', r), 'st', 'fa')
  if not m[1] then return false end
  local keep = m[1] ~= 'r' and run_call[m[1]]
  if keep and tonumber(m[2]) <= now - keep[1] then
    run_ops.forget(q, r)
    rcall('ZREM', k_run(q, 'ud:', m[1]), r)
    return false
  end
  return m[1]
end

-- Store turn job `id` of queue `q` with body `body`: waiting, or scheduled at `at` (µs)
-- when that is later than `now`. An id taken already (a run made again under the id of
-- one retention dropped, whose turn job is still kept) stores nothing.
function run_ops.enqueue(q, id, body, at, now)
  if job_exists(q, id) then return end
  local o = rcall('INCR', k_seq(q))
  if at > now then
    rcall('SET', k_job(q, id), pack_rec({s = 's', q = q, o = o, e = now, p = false, r = at,
      m = body}))
    rcall('ZADD', k_sched(q), string.format('%d', at), id)
    count(q, 's', 1)
  elseif hand_off(q, '0', {id}, {num_text(o)}, {body}, 1, 1, now, num_text(now)) == 0 then
    push_entry(q, '0', id, o, now, body)
    count(q, 'w', 1)
  else
    return  -- handed straight to an idle worker (common/bookkeeping.lua): no notice
  end
  work_queues[q] = true
end

-- Enqueue a turn of run `r` of queue `q`: now (`at` at or before `now`) or at `at` (µs).
-- At most one immediate turn waits at a time: while the last one is still waiting,
-- another immediate one is not enqueued.
function run_ops.wake(q, r, at, now)
  local rk = k_run(q, 'u:', r)
  local immediate = at <= now
  if immediate then
    local t = rcall('HGET', rk, 't')
    if t then
      local s = read_job(q, t, 's')
      if s and s[1] == 'w' then return end
    end
  end
  local id = r .. ':t' .. rcall('HINCRBY', rk, 'n', 1)
  run_ops.enqueue(q, id, rcall('HGET', rk, 'tb'), immediate and 0 or at, now)
  if immediate then rcall('HSET', rk, 't', id) end
end

-- End run `r` of queue `q` in state `st` ('c', 'f', 'x') with result `res` or failure
-- `err`: its waits and kept outcomes go, it joins the queue's ended runs (retention).
function run_ops.finish(q, r, st, res, err, now)
  local rk = k_run(q, 'u:', r)
  rcall('HDEL', rk, 'wj', 'ws', 'wa')
  local t = {'st', st, 'fa', string.format('%d', now)}
  if res then t[#t + 1] = 'res'; t[#t + 1] = res end
  if err then t[#t + 1] = 'err'; t[#t + 1] = err end
  rcall('HSET', rk, unpack(t))
  rcall('DEL', k_run(q, 'uo:', r))
  rcall('ZADD', k_run(q, 'ud:', st), string.format('%d', now), r)
  run_ops.trim(q, st, now)
  -- It ended: announced with the finished jobs' notice as '~!<run id>' (no job id starts
  -- with '~'; a log that grew is '~<run id>'), for wait_run's waiters.
  note_done(q, '~!' .. r)
end

-- Step `id` of run `r` (on queue rq, this script's slot) ended in state `state`: keep
-- its outcome while the run is running, and wake the run when it waits on the step.
-- 1 when the run took it, 0 when there is no such run, it has ended or recorded it.
run_settle = function(rq, r, id, state, res, err, now)
  local rk = k_run(rq, 'u:', r)
  local m = rcall('HMGET', rk, 'st', 'wj')
  if m[1] ~= 'r' then return 0 end
  local ok = k_run(rq, 'uo:', r)
  -- '' marks an outcome an append recorded already (a hand-off applied late or twice).
  if rcall('HGET', ok, id) == '' then return 0 end
  local v = state
  if state == 'c' then v = v .. (res or '') elseif err then v = v .. err end
  rcall('HSET', ok, id, v)
  -- (m[2]: the space-separated ids it waits on)
  if m[2] and string.find(' ' .. m[2] .. ' ', ' ' .. id .. ' ', 1, true) then
    run_ops.wake(rq, r, 0, now)
  end
  return 1
end

-- Job `id` of queue `q` (its hash `jk`) reached final state `state`, and its id ends in
-- ':<digits>': a durable run's step when its body's run_queue names the run's queue.
-- The run is told here, or through the outbox when it is on another slot. With `turn`,
-- the job is a turn of a run of `q` that failed for good.
run_step_done = function(q, id, jk, state, now, turn)
  if turn then
    -- A turn job ('<run id>:t<n>', on the run's own queue) failed for good: its retries
    -- or its stalls are spent, no turn comes again, so the run fails with its record.
    local r = string.match(id, '^(.+):t%d+$')
    if rcall('HGET', k_run(q, 'u:', r), 'st') ~= 'r' then return end
    run_ops.finish(q, r, 'f', nil, rcall('HGET', jk, 'err') or nil, now)
    return
  end
  local f = rcall('HMGET', jk, 'm', 'res', 'err')
  -- The run queue is the body's 14th and last field (run_queue): a fixarray of 14
  -- fields ending with the name as a msgpack str. Read from the end (cmsgpack reads no
  -- bin, and the payload may be long): a queue name is ASCII (keys.py, at most 128
  -- characters), so the first byte from the end at or above 0x80 is the str's header
  -- (fixstr), or str8's 0xd9 just before its length byte.
  local m = f[1]
  if not m or string.byte(m, 1) ~= 0x9e then return end
  local n, rq = #m, nil
  for i = n, math.max(2, n - 300), -1 do
    local b = string.byte(m, i)
    if b >= 0x80 then
      if b >= 0xa0 and b <= 0xbf and b - 0xa0 == n - i and i < n then
        rq = string.sub(m, i + 1)
      elseif b == 0xd9 and string.byte(m, i + 1) == n - i - 1 then
        rq = string.sub(m, i + 2)
      elseif b == n - i and string.byte(m, i - 1) == 0xd9 then
        rq = string.sub(m, i + 1)  -- (a name of 128 characters: the length byte is 0x80)
      end
      break
    end
  end
  if not rq then return end
  local r = string.match(id, '^(.+):%d+$')
  if run_away(q, rq) then
    flow_outbox(q, rq, id .. '|u', {'R', r, rq, id, state, f[2] or false, f[3] or false})
  else
    run_settle(rq, r, id, state, f[2] or nil, f[3] or nil, now)
  end
end

-- Create run `r` on queue `q` with spec `sp` and turn job body `tb` unless it exists:
-- stored running, its first turn enqueued. Its answer: {created 0/1, the run's reply}.
function run_ops.create(q, r, sp, tb, now)
  local created = 0
  if not run_ops.state(q, r, now) then
    rcall('HSET', k_run(q, 'u:', r), 'sp', sp, 'tb', tb, 'st', 'r',
      'ca', string.format('%d', now), 'n', 0)
    run_ops.wake(q, r, 0, now)
    created = 1
  end
  return {created, run_ops.reply(q, r)}
end

-- Compare-and-append number `a` of a run script's arguments `args` (run_append.lua's
-- form: run id, expected length, ... recorded job ids) to its run on queue `q`: applied
-- only while the run is running and its log has the expected length; then the run waits
-- (jobs, a signal, a timer; one already over wakes it at once) or ends. With a fence
-- (a job of this slot and a token, after the recorded ids), applied only while that job
-- is active under that token (the step whose worker records its result before it
-- completes it). Its answer: 'appended', 'conflict', 'finished', 'not_found' or 'fenced'.
function run_ops.append(args, a, q, now)
  local r = args[a]
  local st = run_ops.state(q, r, now)
  if not st then return 'not_found' end
  if st ~= 'r' then return 'finished' end
  local f = a + 11 + tonumber(args[a + 9]) + tonumber(args[a + 10 + tonumber(args[a + 9])])
  if args[f] ~= '' then
    -- (a job waiting or scheduled is a string key: not active, so not held)
    local h = rpcall('HMGET', k_job(args[f + 2], args[f]), 's', 't')
    if type(h) ~= 'table' or h.err or h[1] ~= 'a' or h[2] ~= args[f + 1] then
      return 'fenced'
    end
  end
  local lk = k_run(q, 'ul:', r)
  if rcall('LLEN', lk) ~= tonumber(args[a + 1]) then return 'conflict' end
  local take = args[a + 2]
  if take ~= '' then
    local ik = k_run(q, 'us:', r .. '|' .. take)
    if not rcall('LPOP', ik) then return 'conflict' end
    if rcall('EXISTS', ik) == 0 then rcall('SREM', k_run(q, 'uS:', r), take) end
  end
  local n = tonumber(args[a + 9])
  for s = a + 10, a + 9 + n, 500 do
    rcall('RPUSH', lk, unpack(args, s, math.min(s + 499, a + 9 + n)))
  end
  if n > 0 then note_done(q, '~' .. r) end  -- its log grew: wait_run's waiters
  local rk = k_run(q, 'u:', r)
  rcall('HDEL', rk, 'wj', 'ws', 'wa')
  local state = args[a + 3]
  if state ~= 'r' then
    local res, err = args[a + 4], args[a + 5]
    run_ops.finish(q, r, state, res ~= '-' and string.sub(res, 2) or nil, err ~= '' and err or nil,
      now)
    return 'appended'
  end
  local wj, ws, wa = args[a + 6], args[a + 7], tonumber(args[a + 8])
  local t = {}
  if wj ~= '' then t[#t + 1] = 'wj'; t[#t + 1] = wj end
  if ws ~= '' then t[#t + 1] = 'ws'; t[#t + 1] = ws end
  if wa then t[#t + 1] = 'wa'; t[#t + 1] = args[a + 8] end
  if #t > 0 then rcall('HSET', rk, unpack(t)) end
  -- The outcomes this append records are in the log now: each leaves a mark '' (the
  -- step has ended: a wait on it is over; a late or repeated hand-off of it is not kept
  -- again). The others stay (a step that ended after the turn's read).
  local m = tonumber(args[a + 10 + n])
  if m > 0 then
    local marks = {}
    for j = a + 11 + n, a + 10 + n + m do
      marks[#marks + 1] = args[j]
      marks[#marks + 1] = ''
    end
    rcall('HSET', k_run(q, 'uo:', r), unpack(marks))
  end
  -- A wait already over when it is set wakes the run at once: a step it waits on that
  -- has ended (its outcome or its mark is kept), a signal in the inbox, a timer due.
  local over = (wa and wa <= now)
    or (ws ~= '' and rcall('EXISTS', k_run(q, 'us:', r .. '|' .. ws)) == 1)
  if not over and wj ~= '' then
    local ok = k_run(q, 'uo:', r)
    for id in string.gmatch(wj, '%S+') do
      if rcall('HEXISTS', ok, id) == 1 then over = true; break end
    end
  end
  if over then run_ops.wake(q, r, 0, now) elseif wa then run_ops.wake(q, r, wa, now) end
  return 'appended'
end

-- Run `r` of queue `q` as a reply: {spec, state, created_at, finished_at, result,
-- failure, wait_jobs, wait_signal, wake_at, log, inbox {name, payloads...}, outcomes
-- {id, value, ...}} (false for what it has not).
function run_ops.reply(q, r)
  local m = rcall('HMGET', k_run(q, 'u:', r), 'sp', 'st', 'ca', 'fa', 'res', 'err', 'wj', 'ws', 'wa')
  local inbox = {}
  for _, s in ipairs(rcall('SMEMBERS', k_run(q, 'uS:', r))) do
    local got = rcall('LRANGE', k_run(q, 'us:', r .. '|' .. s), 0, -1)
    if #got > 0 then inbox[#inbox + 1] = {s, got} end
  end
  return {m[1], m[2], m[3], m[4] or '0', m[5], m[6], m[7], m[8], m[9],
    rcall('LRANGE', k_run(q, 'ul:', r), 0, -1), inbox, rcall('HGETALL', k_run(q, 'uo:', r))}
end

-- A run script's reply: its answers and the runs retention dropped.
function run_ops.answer(out)
  flush_counts()
  publish()
  return {out, run_call.gone or {}}
end
