#!lua flags=allow-oom
-- Hand claimed jobs back unrun (worker shutdown): waiting again at their old place,
-- the attempt not spent; cancelled instead if a cancel was requested meanwhile.
-- KEYS[1] = the queue's active zset
-- ARGV: P, queue, failed_ttl_us, failed_max, n, then n x (id, token)
local q, ttl, cap, n = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
if q == '' or not ttl or not is_int(cap) or not is_int(n) or n < 0 or #ARGV ~= 5 + 2 * n then
  return bad_args('release')
end
local now = now_us()
local out = {}
local back = {}
local touched_x = 0
for i = 0, n - 1 do
  local id, tok = ARGV[6 + 2 * i], ARGV[7 + 2 * i]
  local r = read_hash(q, id, 's', 't', 'd', 'q', 'cr', 'p', 'a', 'o', 'w', 'ck', 'fk')
  if not r then
    out[i + 1] = not_active_answer(q, id)
  elseif r[1] == 'a' and r[2] == tok then
    local jk = k_job(q, id)
    redis.call('ZREM', k_active(q), id)
    free_slot(id, q, r[10])
    local attempt = math.max(0, (tonumber(r[7]) or 1) - 1)
    redis.call('HSET', jk, 'd', tok, 'a', attempt)
    if r[5] then
      -- A final state carries its record: Job.result() decodes it.
      redis.call('HSET', jk, 'err', failure_record(CANCELLED_REASON, CANCELLED_TYPE,
        CANCELLED_ON_HAND_BACK, attempt, r[9], now))
      finalize(id, q, 'a', 'x', now)
      touched_x = touched_x + 1
    else
      redis.call('HSET', jk, 's', 'w', 'r', now)  -- due again: waits from the hand-back
      redis.call('HDEL', jk, 't')
      back[#back + 1] = {id, q, sane_prio(r[6]), tonumber(r[8]) or 0, r[11]}
      count(q, 'a', -1)
      count(q, 'w', 1)
      work_queues[q] = true
    end
    out[i + 1] = 0
  elseif r[3] == tok then
    out[i + 1] = 1
  else
    out[i + 1] = 2
  end
end
push_back_in_order(back)
if touched_x > 0 then trim(q, 'x', now, ttl, cap, touched_x + 100) end
flush_counts()
publish()
return flow_reply(out)
