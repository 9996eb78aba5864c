#!lua
-- Enqueue one job under a unique window or a debounce (typedq/flowcontrol.py), atomically
-- with its key's marker; the rules are the embedded broker's (memory/control.py):
--   unique: the marker names the job holding the key; it holds it while it exists and
--     is not final, and once completed until the marker expires (finish.lua's
--     release_unique); a marker with no expiry whose job is gone or final is stale.
--   debounce: the marker names the job collecting the key's enqueues; while that job is
--     a job string (never claimed) scheduled and not due, it takes the new body and
--     runs at min(now + wait, enqueued_at + max_wait).
-- A new job is stored as enqueue.lua stores one (waiting entry or scheduled string).
-- A re-sent call (same request record) returns the first copy's answer.
-- KEYS[1] = this call's request record (on the queue's slot)
-- ARGV: P, max_queue_length, id, queue, priority, eta_us, delay_us, body,
--   marker ('<task>|<key>'), then 'u', window_ms  or  'd', wait_us, max_wait_us, ttl_ms
-- Returns {created (0/1), id of the job}.
local limit, id, q, prio, eta, delay, body, marker, mode =
  tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10]
if not limit or id == '' or q == '' or string.find(q, '|', 1, true) or not is_int(prio)
    or not tonumber(eta) or not tonumber(delay) or marker == '' then
  return bad_args('enqueue_controlled')
end
local window, wait, max_wait, ttl
if mode == 'u' and #ARGV == 11 then
  window = tonumber(ARGV[11])
  if not window or window < 1 then return bad_args('enqueue_controlled') end
elseif mode == 'd' and #ARGV == 13 then
  wait, max_wait, ttl = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
  if not wait or not max_wait or not ttl or wait <= 0 or max_wait < wait or ttl < 1 then
    return bad_args('enqueue_controlled')
  end
else
  return bad_args('enqueue_controlled')
end

local prev = rpcall('GET', KEYS[1])
if type(prev) == 'string' then
  local c, pid = string.match(prev, '^([01])|(.+)$')
  if c then return {tonumber(c), pid} end
end

local now = now_us()

-- Store job `id` new (1), or not when the id exists (0); the refusal of a full queue.
local function store(run_delay)
  if job_exists(q, id) then return 0 end
  if limit > 0 then
    local full = queue_full(q, 1, limit)
    if full then return full end
  end
  local order = rcall('INCRBY', k_seq(q), 1)
  local run_at = run_at_of(eta, run_delay, now)
  if run_at > now then
    rcall('SET', k_job(q, id), pack_rec({s = 's', q = q, o = order, e = now,
      p = prio ~= '0' and prio, r = run_at, m = body}))
    rcall('ZADD', k_sched(q), run_at, id)
    count(q, 's', 1)
  else
    local group, weight = fair_of(body)  -- a fair task's job (typedq.fair): its lane
    if group then
      store_fair(q, prio, id, order, now, body, false, group, weight)
    else
      local o = int_text(order)
      push_entries(q, prio, k_wait(q, prio), {pack_entry(id, o, last_now_text, body)})
      rcall('HSET', k_idx(q, id), id, idx_val(o, prio))
    end
    count(q, 'w', 1)
  end
  work_queues[q] = true
  return 1
end

local function answer(created, job_id)
  rcall('SET', KEYS[1], created .. '|' .. job_id, 'PX', REQ_TTL_MS)
  flush_counts()
  publish()
  return {created, job_id}
end

if mode == 'u' then
  local mk = k_unique(q, marker)
  local held = rcall('GET', mk)
  if held then
    local r = read_job(q, held, 's')
    local s = r and r[1]
    if (s and s ~= 'c' and s ~= 'f' and s ~= 'x') or rcall('PTTL', mk) > 0 then
      return answer(0, held)
    end
    -- Stale: its job is gone (removed, purged) or ended without releasing it.
    rcall('DEL', k_unique_job(q, held))
  end
  local created = store(delay)
  if type(created) == 'table' then return created end
  if created == 1 then
    rcall('SET', mk, id)
    rcall('SET', k_unique_job(q, id), string.format('%d', window) .. '|' .. marker)
    -- Finalize looks for the key a job holds only in queues where one may.
    rcall('HSET', k_events_cfg(q), 'u', '1')
  end
  return answer(created, id)
end

local mk = k_debounce(q, marker)
local held = rcall('GET', mk)
if held then
  local jk = k_job(q, held)
  local v = rpcall('GET', jk)
  local f = type(v) == 'string' and parse_rec(v, q)
  if f and f.s == 's' and f.r and tonumber(f.r) > now then
    local run_at = math.min(now + wait, tonumber(f.e) + max_wait)
    f.r, f.m, f.p = run_at, body, prio ~= '0' and prio
    rcall('SET', jk, pack_rec(f))
    rcall('ZADD', k_sched(q), run_at, held)
    return answer(0, held)
  end
end
local created = store(string.format('%d', wait))
if type(created) == 'table' then return created end
if created == 1 then rcall('SET', mk, id, 'PX', string.format('%d', ttl)) end
return answer(created, id)
