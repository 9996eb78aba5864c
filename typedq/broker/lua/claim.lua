#!lua
-- Claim up to `limit` due jobs across queues: highest priority first, then oldest.
-- Promotes due scheduled jobs first. Each claimed job gets the token
-- '<claim token>.<i>'; the claim token is chosen by the client, and the claim is
-- recorded under the worker, so a re-sent claim (lost reply, client retry) returns
-- the same jobs instead of claiming more.
-- KEYS[1] = active, KEYS[2] = seq, KEYS[3] = this worker's claim record
-- ARGV: P, limit, lease_us, claim token, worker id, nq, queues...
-- Returns {next_due_us (-1: nothing scheduled), then per job: id, message, token,
--          attempt, enqueued_at_us, stalls}
local limit, lease, token, worker, nq =
  tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5], tonumber(ARGV[6])
if not is_int(limit) or limit < 0 or not lease or lease <= 0 or token == ''
    or not is_int(nq) or nq < 1 or #ARGV ~= 6 + nq then
  return bad_args('claim')
end
local queues = {}
for i = 1, nq do
  if ARGV[6 + i] == '' then return bad_args('claim') end
  queues[i] = ARGV[6 + i]
end

local now = now_us()
local out = {-1}

-- A re-sent claim: hand back what the first copy claimed (still ours), nothing new.
local prev = redis.pcall('GET', KEYS[3])
if type(prev) == 'string' and string.sub(prev, 1, #token + 1) == token .. '\n' then
  local prefix = token .. '.'
  for id in string.gmatch(string.sub(prev, #token + 2), '[^\n]+') do
    local r = read_job(id, 's', 't', 'm', 'a', 'e', 'k')
    if r and r[1] == 'a' and r[2] and string.sub(r[2], 1, #prefix) == prefix then
      local n = #out
      out[n + 1], out[n + 2], out[n + 3] = id, r[3] or '', r[2]
      out[n + 4], out[n + 5], out[n + 6] = tonumber(r[4]) or 1, tonumber(r[5]) or 0, tonumber(r[6]) or 0
    end
  end
  return out
end

-- Promote due scheduled jobs (bounded per call; the rest next time).
for _, q in ipairs(queues) do
  local sk = k_sched(q)
  local due = redis.call('ZRANGEBYSCORE', sk, '-inf', now, 'LIMIT', 0, 1000)
  if #due > 0 then
    local order = redis.call('INCRBY', KEYS[2], #due) - #due
    for i, id in ipairs(due) do
      local r = read_job(id, 's', 'p')
      if r and r[1] == 's' then
        redis.call('HSET', k_job(id), 's', 'w', 'o', order + i)
        redis.call('HDEL', k_job(id), 'r')
        push_waiting(q, sane_prio(r[2]), id, false)
        count(q, 's', -1)
        count(q, 'w', 1)
      end
    end
    redis.call('ZREM', sk, unpack(due))
  end
end

-- The best non-empty priority level of a queue: its priority and list key.
local function head_of(q)
  while true do
    local t = redis.call('ZRANGE', k_levels(q), 0, 0)
    if #t == 0 then return nil end
    local lk = k_wait(q, t[1])
    if redis.call('TYPE', lk).ok == 'list' then return t[1], lk end
    redis.call('ZREM', k_levels(q), t[1])
  end
end

local function head_order(lk)
  local id = redis.call('LINDEX', lk, -1)
  if not id then return 0 end
  local o = redis.pcall('HGET', k_job(id), 'o')
  return tonumber(o) or 0
end

local claimed, pops = 0, 0
local max_pops = limit + 1000  -- stale entries are skipped, but not without bound
local lease_until = now + lease
local ids = {}

local function activate(id, q)
  local jk = k_job(id)
  local ty = redis.call('TYPE', jk).ok
  if ty == 'none' then return end  -- an id with no job behind it: dropped
  if ty ~= 'hash' then
    -- Bytes that are not a job hash: keep them as the job's message, so the
    -- worker fails this job with reason decode_error instead of losing it. (It
    -- most likely replaced a counted waiting job, so the counts stay as they are.)
    local raw = ''
    if ty == 'string' then raw = redis.call('GET', jk) end
    redis.call('DEL', jk)
    redis.call('HSET', jk, 'm', raw, 'q', q, 's', 'w', 'e', now, 'o', 0)
  end
  local r = redis.call('HMGET', jk, 's', 'm', 'a', 'e', 'k')
  if r[1] ~= 'w' then return end  -- stale entry: the job left waiting meanwhile
  claimed = claimed + 1
  local attempt = (tonumber(r[3]) or 0) + 1
  local tok = token .. '.' .. claimed
  redis.call('HSET', jk, 's', 'a', 'a', attempt, 't', tok, 'st', now, 'w', worker)
  redis.call('ZADD', KEYS[1], lease_until, id)
  count(q, 'w', -1)
  count(q, 'a', 1)
  ids[#ids + 1] = id
  local n = #out
  out[n + 1], out[n + 2], out[n + 3] = id, r[2] or '', tok
  out[n + 4], out[n + 5], out[n + 6] = attempt, tonumber(r[4]) or 0, tonumber(r[5]) or 0
end

while claimed < limit and pops < max_pops do
  local bq, blk
  if nq == 1 then
    local prio
    prio, blk = head_of(queues[1])
    if not prio then break end
    bq = queues[1]
  else
    local bestp, besto
    for _, q in ipairs(queues) do
      local prio, lk = head_of(q)
      if prio then
        local p = tonumber(prio)
        if not bq or p > bestp then
          bq, blk, bestp, besto = q, lk, p, nil
        elseif p == bestp then
          -- Equal priority in two queues: the older head goes first.
          besto = besto or head_order(blk)
          local o = head_order(lk)
          if o < besto then bq, blk, besto = q, lk, o end
        end
      end
    end
    if not bq then break end
  end
  -- One queue: pop as many as wanted at once; several: one at a time, re-comparing.
  local want = 1
  if nq == 1 then want = math.min(limit - claimed, max_pops - pops) end
  local popped = redis.call('RPOP', blk, want)
  if not popped then popped = {} end
  for _, id in ipairs(popped) do
    pops = pops + 1
    activate(id, bq)
  end
end

if claimed > 0 then
  redis.call('SET', KEYS[3], token .. '\n' .. table.concat(ids, '\n'), 'PX', 60000)
end
if claimed < limit then
  if pops >= max_pops then
    out[1] = 0  -- stopped early: more may be waiting
  else
    local next_due = nil
    for _, q in ipairs(queues) do
      local t = redis.call('ZRANGE', k_sched(q), 0, 0, 'WITHSCORES')
      if #t > 0 and (not next_due or tonumber(t[2]) < next_due) then next_due = tonumber(t[2]) end
    end
    if next_due then out[1] = math.max(0, next_due - now) end
  end
end
flush_counts()
return out
