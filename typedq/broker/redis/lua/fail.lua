#!lua flags=allow-oom
-- Record failed attempts, fenced by token (outcomes as in complete.lua).
-- mode 'r': retry after delay_us (0 = waiting at once) unless a cancel was requested
-- (its due time 'r' is when it becomes claimable again, now for an immediate retry);
-- 'l': like 'r', but the attempt is given back (RateLimited: not spent);
-- 'f': failed for good; 'p': failed for good but parked (a deploy's undecodable payload:
-- its flow is not settled, it waits for an operator retry, field 'pk'); 'x': cancelled. A non-empty `message` replaces the stored
-- envelope (a job whose bytes could not be decoded gets a readable one).
-- KEYS[1] = the queue's active zset (the slot this runs on)
-- ARGV: P, queue, failed_ttl_us, failed_max, n, then n x (id, token, error, mode, delay_us,
--       message), [fan-out members' spans: see read_span_links]
local q, ttl, cap, n = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
if q == '' or not ttl or not is_int(cap) or not is_int(n) or n < 0
    or (#ARGV ~= 5 + 6 * n and not read_span_links(ARGV, 6 + 6 * n)) then
  return bad_args('fail')
end
for i = 0, n - 1 do
  local b = 6 + 6 * i
  local mode = ARGV[b + 3]
  if (mode ~= 'r' and mode ~= 'l' and mode ~= 'f' and mode ~= 'x' and mode ~= 'p') or not tonumber(ARGV[b + 4]) then
    return bad_args('fail')
  end
end
local now = now_us()
local out = {}
local touched_f, touched_x = 0, 0
for i = 0, n - 1 do
  local b = 6 + 6 * i
  local id, tok, mode, delay = ARGV[b], ARGV[b + 1], ARGV[b + 3], tonumber(ARGV[b + 4])
  local r = read_hash(q, id, 's', 't', 'd', 'q', 'cr', 'p', 'ck', 'a', 'fl', 'fm', 'fs', 'fq',
    'fk')
  if not r then
    out[i + 1] = not_active_answer(q, id)
  elseif r[1] == 'a' and r[2] == tok then
    flow_link_of(q, id, r[9], r[10], r[11], r[12])
    local jk = k_job(q, id)
    add_error(q, id, ARGV[b + 2])
    redis.call('HSET', jk, 'd', tok)
    if ARGV[b + 5] ~= '' then redis.call('HSET', jk, 'm', ARGV[b + 5]) end
    redis.call('ZREM', k_active(q), id)
    free_slot(id, q, r[7])
    if mode == 'x' or r[5] then
      finalize(id, q, 'a', 'x', now)
      touched_x = touched_x + 1
    elseif mode == 'f' or mode == 'p' then
      if mode == 'p' and r[9] then
        -- Parked: no flow link for finalize, so its flow neither fails nor hands off.
        flow_links[jk] = false
        redis.call('HSET', jk, 'pk', '1')
      end
      finalize(id, q, 'a', 'f', now)
      touched_f = touched_f + 1
    else
      redis.call('HDEL', jk, 't')
      if mode == 'l' then
        redis.call('HSET', jk, 'a', math.max(0, (tonumber(r[8]) or 1) - 1))
      end
      if delay > 0 then
        redis.call('HSET', jk, 's', 's', 'r', now + delay)
        redis.call('ZADD', k_sched(q), now + delay, id)
        count(q, 's', 1)
      else
        redis.call('HSET', jk, 's', 'w', 'o', redis.call('INCR', k_seq(q)), 'r', now)
        push_waiting(q, sane_prio(r[6]), id, false, r[13])  -- a fair job: its key's lane
        count(q, 'w', 1)
      end
      count(q, 'a', -1)
      roll(q, 'r')
      work_queues[q] = true
    end
    out[i + 1] = 0
  elseif r[3] == tok then
    out[i + 1] = 1
  else
    out[i + 1] = 2
  end
end
if touched_f > 0 then trim(q, 'f', now, ttl, cap, touched_f + 100) end
if touched_x > 0 then trim(q, 'x', now, ttl, cap, touched_x + 100) end
flush_counts()
publish()
return flow_reply(out)
