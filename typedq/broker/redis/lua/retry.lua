#!lua flags=allow-oom
-- Put failed or cancelled jobs back to waiting (tail of their level, fresh attempt
-- and stall counts; finish time, result, error, progress cleared).
-- KEYS[1] = the queue's order counter
-- ARGV: P, queue, ids...
-- Returns per id: 'retried', 'not_retryable', 'in_flow' (a workflow's job that cannot
-- run again alone, see flow_retry) or 'not_found'. A workflow's step resumes its flow.
if #ARGV < 2 or ARGV[2] == '' then return bad_args('retry') end
local q = ARGV[2]
local now = now_us()

-- A failed or cancelled job of a workflow is retried (this script): nil when it may go
-- back to waiting, else the answer 'in_flow' (nothing changed). A step that ran, of a
-- flow that has ended, resumes its flow: the later steps (ended with it, never run,
-- still held: 'mh') are held again and the flow record is made again, so the step's
-- completion hands off as the first time and the flow's own job completes. Refused: a
-- fan-out member (its flow fanned in or failed without it, and the other members'
-- results are gone), a step that never ran (retry the one that failed), a job of a
-- flow that is running (resumed already), or a flow whose later steps are gone.
local function flow_retry(q, id)
  local r = read_hash(q, id, 'fl', 'fm', 'fs', 'fq', 'mh', 'fx', 'pk')
  if not r or not r[1] then return nil end
  local f, fq = r[1], r[4] or q
  if r[7] then
    -- Parked (fail.lua's 'p'): its flow still waits for it and goes on from here.
    redis.call('HDEL', k_job(q, id), 'pk')
    -- (A flow across slots keeps its record on its root's slot, out of reach here: its
    -- completion settles through the outbox, which finds the flow or not.)
    if r[6] == '1' and fq ~= q then return nil end
    -- (A flow whose end is under way, flow_settle.lua's flow_end, waits for nothing.)
    local e = redis.call('HMGET', k_flow(fq, f), 'S', 'E')
    if e[1] and not e[2] then return nil end
    return 'in_flow'
  end
  if r[2] or r[5] or not r[3] then return 'in_flow' end
  -- A flow across slots resumes only from its root's queue, with every later step there.
  local across = r[6] == '1'
  if across and fq ~= q then return 'in_flow' end
  local fk = k_flow(fq, f)
  if redis.call('EXISTS', fk) == 1 then return 'in_flow' end
  local shape = read_hash(fq, f, 'fS', 'fn', 'fsq')
  if not shape or not tonumber(shape[1]) then return 'in_flow' end
  local steps, k = tonumber(shape[1]), tonumber(r[3])
  local sq = flow_queues(shape[3], steps, fq)
  local later = {}
  for j = k + 1, steps - 1 do
    local jid, jq = flow_step_id(f, j, steps), sq[j + 1]
    if across and jq ~= q then return 'in_flow' end
    local s = read_hash(jq, jid, 's', 'mh')
    if not s or (s[1] ~= 'f' and s[1] ~= 'x') or not s[2] then return 'in_flow' end
    later[#later + 1] = {jid, jq, s[1]}
  end
  for _, j in ipairs(later) do
    local jid, jq, st = j[1], j[2], j[3]
    redis.call('ZREM', k_done(jq, st), jid)
    redis.call('HDEL', k_job(jq, jid), 'err', 'fa')
    redis.call('HSET', k_job(jq, jid), 's', 's', 'r', HELD_US)
    redis.call('ZADD', k_sched(jq), HELD_US, jid)
    count(jq, st, -1)
    count(jq, 's', 1)
  end
  redis.call('HSET', fk, 'S', steps, 'n', tonumber(shape[2]) or 0, 'c', 0, 'col', '0',
    'pol', 'a', 'mq', '', 'sq', shape[3] or '')
  if across then redis.call('HSET', fk, 'x', '1') end
  return nil
end

local out = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local r = read_job(q, id, 's', 'q', 'p', 'fk', 'm')
  if not r then
    out[i - 2] = 'not_found'
  elseif r[1] ~= 'f' and r[1] ~= 'x' then
    out[i - 2] = 'not_retryable'
  elseif flow_retry(q, id) then
    out[i - 2] = 'in_flow'  -- see flow_retry above
  else
    local jk = k_job(q, id)
    redis.call('ZREM', k_done(q, r[1]), id)
    redis.call('HDEL', jk, 'a', 'k', 'st', 'fa', 'res', 'err', 'pg', 'cr', 'w', 't', 'd')
    -- Due again now: its queue wait counts from the retry, not from its enqueue.
    redis.call('HSET', jk, 's', 'w', 'o', redis.call('INCR', k_seq(q)), 'r', now)
    -- A fair job waits in its key's lane: the key a claim kept on it ('fk'), or for one
    -- never claimed (cancelled while waiting) its body's (lanes.lua fair_of).
    local fk = r[4]
    if not fk then
      local group, weight = fair_of(r[5])
      if group then fk = weight .. '|' .. group end
    end
    push_waiting(q, sane_prio(r[3]), id, false, fk)
    count(q, r[1], -1)
    count(q, 'w', 1)
    work_queues[q] = true
    out[i - 2] = 'retried'
  end
end
flush_counts()
publish()
return out
