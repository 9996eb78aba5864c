#!lua flags=allow-oom
-- Recover up to `limit` jobs whose lease expired, then trim retention. Each job is
-- recovered once however many workers race (one atomic script). The stall count
-- is bumped; past max_stalls the job fails with reason 'stalled', and a job whose
-- cancel was requested is cancelled.
-- KEYS[1] = the queue's active zset
-- Also hands back the queue's outbox entries (flows across slots, see common/flows.lua)
-- written at least handoff_age_us ago: the caller applies them (their writer died
-- before it did, or its apply failed). And releases the next members of a large fan-out
-- whose release made no step for a while (common/flow_settle.lua's flow_ops.release_due).
-- ARGV: P, queue, limit, max_stalls, completed_ttl_us, completed_max, failed_ttl_us,
--       failed_max, handoff_age_us, ids the caller holds and renews itself (left
--       alone: see Broker.recover_stalled's `holding`)...
-- Returns the number of jobs recovered (with the hand-offs: see flow_reply).
local q, limit, max_stalls = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local cttl, ccap, fttl, fcap = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local handoff_age = tonumber(ARGV[9])
if q == '' or not is_int(limit) or limit < 0 or not is_int(max_stalls) or not cttl
    or not is_int(ccap) or not fttl or not is_int(fcap) or not handoff_age then
  return bad_args('recover')
end
local now = now_us()
local active = k_active(q)
trim(q, 'c', now, cttl, ccap, 1000)
trim(q, 'f', now, fttl, fcap, 1000)
trim(q, 'x', now, fttl, fcap, 1000)

local recovered = 0
local back = {}
if limit > 0 then
  local expired = redis.call('ZRANGEBYSCORE', active, '-inf', '(' .. string.format('%d', now),
    'LIMIT', 0, limit)
  local holding = {}
  for i = 10, #ARGV do holding[ARGV[i]] = true end
  for _, id in ipairs(expired) do
    local r = false
    if not holding[id] then
      redis.call('ZREM', active, id)
      r = read_hash(q, id, 's', 'q', 'a', 'k', 'cr', 'w', 'p', 'o', 'ck', 'fk')
    end
    if r and r[1] == 'a' then
      recovered = recovered + 1
      local jk = k_job(q, id)
      free_slot(id, q, r[9])
      local stalls = (tonumber(r[4]) or 0) + 1
      local attempt = tonumber(r[3]) or 0
      redis.call('HSET', jk, 'k', stalls)
      redis.call('HDEL', jk, 'd', 't')
      if r[5] then
        redis.call('HSET', jk, 'err', failure_record(CANCELLED_REASON, CANCELLED_TYPE,
          CANCELLED_WORKER_LOST, attempt, r[6], now))
        finalize(id, q, 'a', 'x', now)
      elseif stalls > max_stalls then
        add_error(q, id, failure_record(STALLED_REASON, STALLED_TYPE,
          string.format(STALLED_FORMAT, stalls, stalls, max_stalls), attempt, r[6], now))
        finalize(id, q, 'a', 'f', now)
      else
        redis.call('HSET', jk, 's', 'w', 'r', now)  -- due again: waits from now
        back[#back + 1] = {id, q, sane_prio(r[7]), tonumber(r[8]) or 0, r[10]}
        count(q, 'a', -1)
        count(q, 'w', 1)
        work_queues[q] = true
      end
    end
  end
end
push_back_in_order(back)
flow_ops.outbox_due(q, now, handoff_age, 100)
-- A large fan-out whose client stopped releasing its staged members: the next chunk.
flow_ops.release_due(q, now)
flush_counts()
publish()
return flow_reply(recovered)
