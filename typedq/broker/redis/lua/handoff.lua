#!lua flags=allow-oom
-- Direct hand-off (issue 31): an idle worker's registration in its queues, so that an
-- enqueue hands it new jobs straight away (common/bookkeeping.lua's hand_off) instead
-- of storing them for a claim; the worker waits for them with a blocking pop of its
-- registration's inbox (one hop from enqueue to worker). Ends the worker's previous
-- registration, then makes a new one.
-- KEYS[1] = the home queue's active zset (its slot holds the inboxes)
-- ARGV: P, home queue, old token ('' none), new token ('' none: only end the old),
--       slots, lease_us, ttl_ms, worker id, recover ('1': answer every job handed to the
--       old registration that is still active under its hand-off token, not only the
--       ones left in its inbox: the worker lost a pop's answer), nq, queues...
-- Ending: no more jobs are handed to the old registration; the jobs left in its inbox
-- (handed, not yet taken) are in the answer, already claimed for the worker.
-- Registering (new token, slots > 0) only when the old one left nothing and nothing
-- waits in the queues (else the worker claims: status 1); the registration sets the
-- queues' waiter marks, so any call that stores work for them ends it (publish's
-- wake_handoffs pushes '' to its inbox). It lasts ttl_ms unless renewed.
-- Returns {status (0 registered, 1 not registered, 2 ended only), next_due_us (-1:
--   nothing scheduled), then per job the 8 fields of claim.lua's answer}
local home, old, new = ARGV[2], ARGV[3], ARGV[4]
local slots, lease, ttl = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local worker, recover, nq = ARGV[8], ARGV[9] == '1', tonumber(ARGV[10])
if home == '' or not is_int(slots) or slots < 0 or not is_int(lease) or lease < 1
    or not is_int(ttl) or ttl < 1 or not is_int(nq) or nq < 1 or #ARGV ~= 10 + nq then
  return bad_args('handoff')
end
local now = now_us()
local out = {2, -1}
local woke = false

-- The jobs of a registration's lines '<queue>|<id>' still active under its hand-off
-- token '<tok>.<id>' (the worker's to run), as claim answer fields.
local function still_handed(tok, lines)
  for _, line in ipairs(lines) do
    local q, id = string.match(line, '^([^|]*)|(.*)$')
    local r = q and read_hash(q, id, 's', 't', 'm', 'a', 'e', 'k', 'q', 'r')
    if r and r[1] == 'a' and r[2] == tok .. '.' .. id then
      local n = #out
      out[n + 1], out[n + 2], out[n + 3] = id, r[3] or '', r[2]
      out[n + 4], out[n + 5], out[n + 6] = tonumber(r[4]) or 1, tonumber(r[5]) or 0, tonumber(r[6]) or 0
      out[n + 7], out[n + 8] = r[7] or q, tonumber(r[8]) or 0
    end
  end
end

if old ~= '' then
  local inbox = k_q(home) .. 'I:' .. old
  -- What an end answered, kept a request TTL: a re-send of it (its answer was lost)
  -- answers the same jobs again, those still handed to the old registration.
  local answered = inbox .. ':e'
  if rcall('EXISTS', answered) == 1 then
    still_handed(old, rcall('LRANGE', answered, 0, -1))
  else
    rcall('DEL', inbox .. ':c')
    for qi = 11, 10 + nq do rcall('HDEL', k_fixed(ARGV[qi], 'H'), old) end
    local left = rcall('LRANGE', inbox, 0, -1)
    rcall('DEL', inbox)
    for _, e in ipairs(left) do
      if e == '' then woke = true end
    end
    if recover then
      still_handed(old, rcall('LRANGE', inbox .. ':h', 0, -1))
    else
      for _, e in ipairs(left) do
        if e ~= '' then
          local id, tok, e_at, q, m = string.match(e, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|(.*)$')
          if id then
            -- Still ours (a cancel may have taken it meanwhile: then it is not).
            local r = read_hash(q, id, 's', 't')
            if r and r[1] == 'a' and r[2] == tok then
              local n = #out
              out[n + 1], out[n + 2], out[n + 3], out[n + 4] = id, m, tok, 1
              out[n + 5], out[n + 6], out[n + 7], out[n + 8] = tonumber(e_at) or 0, 0, q, 0
            end
          end
        end
      end
    end
    rcall('DEL', inbox .. ':h')
    if #out > 2 then
      local lines = {}
      for i = 3, #out, 8 do lines[#lines + 1] = out[i + 6] .. '|' .. out[i] end
      rcall('RPUSH', answered, unpack(lines))
      rcall('PEXPIRE', answered, REQ_TTL_MS)
    end
  end
end

-- The earliest scheduled job of the queues (the worker's wait must not pass it).
for qi = 11, 10 + nq do
  local t = rcall('ZRANGE', k_sched(ARGV[qi]), '0', '0', 'WITHSCORES')
  if #t > 0 then
    local due = math.max(0, tonumber(t[2]) - now)
    if out[2] < 0 or due < out[2] then out[2] = due end
  end
end

if new == '' or slots == 0 then return out end
out[1] = 1
if #out > 2 or woke then return out end
for qi = 11, 10 + nq do
  if rcall('EXISTS', k_levels(ARGV[qi])) == 1 then return out end
end
local inbox = k_q(home) .. 'I:' .. new
rcall('SET', inbox .. ':c', slots .. '|' .. lease .. '|' .. ttl .. '|' .. worker, 'PX', ttl)
for qi = 11, 10 + nq do
  local q = ARGV[qi]
  rcall('HSET', k_fixed(q, 'H'), new, home)
  rcall('PEXPIRE', k_fixed(q, 'H'), ttl)
  rcall('SET', k_waiter(q), '1')
end
out[1] = 0
return out
