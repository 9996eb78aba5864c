#!lua flags=allow-oom
-- Compare-and-append to durable runs of one queue (typedq.broker.runs.RunAppend; the
-- embedded broker's RunStore.append is the reference): applied only while the run is
-- running and its log has the expected length. Then the run waits (jobs, a signal, a
-- timer; one already over wakes it at once) or ends.
-- KEYS[1] = the queue's order counter
-- ARGV: P, queue, completed ttl (µs), completed max, failed ttl, failed max, then per
--   append: run id, expected length, signal to take ('' none), state letter (r c f x),
--   result ('-' none, else '+' and the result), failure ('' none), wait jobs
--   (space-separated), wait signal ('' none), wake at (µs, '' none), n, n entries,
--   m, m recorded job ids
-- Returns {per append 'appended' | 'conflict' | 'finished' | 'not_found', ids dropped}.
local q = ARGV[2]
if #ARGV < 6 or q == '' then return bad_args('run_append') end
run_ops.bounds(ARGV[3], ARGV[4], ARGV[5], ARGV[6])
local now = now_us()

local function append(a)
  local r = ARGV[a]
  local st = run_ops.state(q, r, now)
  if not st then return 'not_found' end
  if st ~= 'r' then return 'finished' end
  local lk = k_run(q, 'ul:', r)
  if rcall('LLEN', lk) ~= tonumber(ARGV[a + 1]) then return 'conflict' end
  local take = ARGV[a + 2]
  if take ~= '' then
    local ik = k_run(q, 'us:', r .. '|' .. take)
    if not rcall('LPOP', ik) then return 'conflict' end
    if rcall('EXISTS', ik) == 0 then rcall('SREM', k_run(q, 'uS:', r), take) end
  end
  local n = tonumber(ARGV[a + 9])
  for s = a + 10, a + 9 + n, 500 do
    rcall('RPUSH', lk, unpack(ARGV, s, math.min(s + 499, a + 9 + n)))
  end
  if n > 0 then note_done(q, '~' .. r) end  -- its log grew: wait_run's waiters
  local rk = k_run(q, 'u:', r)
  rcall('HDEL', rk, 'wj', 'ws', 'wa')
  local state = ARGV[a + 3]
  if state ~= 'r' then
    local res, err = ARGV[a + 4], ARGV[a + 5]
    run_ops.finish(q, r, state, res ~= '-' and string.sub(res, 2) or nil, err ~= '' and err or nil,
      now)
    return 'appended'
  end
  local wj, ws, wa = ARGV[a + 6], ARGV[a + 7], tonumber(ARGV[a + 8])
  local t = {}
  if wj ~= '' then t[#t + 1] = 'wj'; t[#t + 1] = wj end
  if ws ~= '' then t[#t + 1] = 'ws'; t[#t + 1] = ws end
  if wa then t[#t + 1] = 'wa'; t[#t + 1] = ARGV[a + 8] end
  if #t > 0 then rcall('HSET', rk, unpack(t)) end
  -- The outcomes this append records are in the log now: each leaves a mark '' (the
  -- step has ended: a wait on it is over; a late or repeated hand-off of it is not kept
  -- again). The others stay (a step that ended after the turn's read).
  local m = tonumber(ARGV[a + 10 + n])
  if m > 0 then
    local marks = {}
    for j = a + 11 + n, a + 10 + n + m do
      marks[#marks + 1] = ARGV[j]
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

local out = {}
local a = 7
while a <= #ARGV do
  if a + 10 > #ARGV then return bad_args('run_append') end
  local n = tonumber(ARGV[a + 9])
  local m = n and tonumber(ARGV[a + 10 + n])
  if not m then return bad_args('run_append') end
  out[#out + 1] = append(a)
  a = a + 11 + n + m
end
return run_ops.answer(out)
