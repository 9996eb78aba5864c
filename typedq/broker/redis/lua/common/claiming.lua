-- common/claiming.lua: Taking jobs for claim.lua: the re-sent claim's answer, settling
-- the completions a claim refills, promoting due scheduled jobs, comparing the heads of
-- several queues, turning a popped entry into a claimed job (activate), fair keys' turns
-- (take_turn, divert: common/lanes.lua), and when the next job is due.
-- (A part of the shared prelude, in the order of scripts.py's PARTS: README.md.)
--
-- Fields of claim_ops (common/gates.lua). The claim's state is the table `c` claim.lua
-- makes once per call: c.limit (jobs wanted), c.now, c.worker, c.out (the answer: next
-- due, then 8 fields per job), c.claimed (jobs taken so far), c.pops and c.max_pops (level
-- pops so far, and their bound), c.has_limits, c.tok_prefix ('<claim token>.'),
-- c.lease_until (as text), c.ids and c.one_line (the claim record's lines: a table for a
-- claim of several jobs, else the one line; c.bare: a claim of one queue, whose lines are
-- the ids alone), c.leases (queue -> lease_until, id, ...: the
-- active sets written once at the end, for a claim of several jobs), and the gates'
-- fields (common/gates.lua); c.other: true once the claim took (or looked at) anything but a
-- waiting entry (a job with a key of its own, a fair turn): claim.lua's shortcuts then stand
-- down.

-- The answer of a claim with a settle section: the claim's answer and the completions'
-- outcomes, once the completions' counts are written and announced.
function claim_ops.settle_answer(out, settled)
  flush_counts()
  publish()
  return flow_reply({out, settled})
end

-- The completions of a claim's settle section (`settles`: per settled queue, five
-- entries: queue, ttl, cap, its first item's index in `args`, n), completed as
-- complete.lua does; their outcomes, in order.
function claim_ops.settle(args, settles, now)
  local settled = {}
  local total = 0
  for g = 5, #settles, 5 do total = total + settles[g] end
  batch_zsets(total > 1)  -- one write per sorted set, not per job (common/bookkeeping.lua)
  for g = 1, #settles, 5 do
    local sq, b, n = settles[g], settles[g + 3], settles[g + 4]
    for i = 0, n - 1 do
      local a = b + 3 * i
      settled[#settled + 1] = complete_one(sq, args[a], args[a + 1], args[a + 2], now)
    end
    trim(sq, 'c', now, settles[g + 1], settles[g + 2], n + 100)
  end
  return settled
end

-- A re-sent claim: hand back into `out` what the first copy claimed (its record `prev`,
-- '<token>\n' then lines '<queue>|<id>', or '<id>' of queue `q1`: a claim of one queue),
-- the jobs still ours.
function claim_ops.claimed_before(out, prev, token, q1)
  local prefix = token .. '.'
  for line in string.gmatch(string.sub(prev, #token + 2), '[^\n]+') do
    local q, id = string.match(line, '^([^|]*)|(.*)$')
    if not q then q, id = q1, line end  -- (a job id holds no '|')
    local r = q and read_hash(q, id, 's', 't', 'm', 'a', 'e', 'k', 'q', 'r')
    if r and r[1] == 'a' and r[2] and string.sub(r[2], 1, #prefix) == prefix then
      local n = #out
      out[n + 1], out[n + 2], out[n + 3] = id, r[3] or '', r[2]
      out[n + 4], out[n + 5], out[n + 6] = tonumber(r[4]) or 1, tonumber(r[5]) or 0, tonumber(r[6]) or 0
      out[n + 7] = r[7] or q
      out[n + 8] = tonumber(r[8]) or 0
    end
  end
end

-- Promote queue q's due scheduled jobs (bounded per call; the rest next time). A
-- promoted job keeps its due time 'r': its queue wait counts from it.
-- Returns what it learnt of the set's head, which a claim that comes up short would read
-- again for its next due time (next_due's `known`): false when nothing is scheduled, the
-- head's due time (µs) when it is not due yet; nil when it promoted jobs (the head moved).
-- One command for a queue with nothing due (the usual case), not one here and one there.
function claim_ops.promote_due(q)
  local sk = k_sched(q)
  local head = rcall('ZRANGE', sk, '0', '0', 'WITHSCORES')
  if #head == 0 then return false end
  local first = tonumber(head[2])
  if first and first > last_now then return first end
  local due = rcall('ZRANGEBYSCORE', sk, '-inf', last_now_text, 'LIMIT', '0', '1000')
  if #due > 0 then
    local order = rcall('INCRBY', k_seq(q), #due) - #due
    for i, id in ipairs(due) do
      local jk = k_job(q, id)
      local ty, prio, fk = rcall('TYPE', jk).ok, nil, nil
      if ty == 'string' then
        -- A scheduled job string becomes a waiting entry (see keys.py).
        local f = parse_rec(rcall('GET', jk), q)
        if f and f.s == 's' and f.q == q then
          -- It keeps its due time: its queue wait counts from it (keys.py). A fair job
          -- keeps its job string and waits in its key's lane (common/lanes.lua).
          local group, weight = fair_of(f.m)
          if group then
            store_fair(q, sane_prio(f.p), id, order + i, f.e, f.m, f.r, group, weight)
          else
            rcall('DEL', jk)
            push_entry(q, sane_prio(f.p), id, order + i, f.e, f.m, f.r)
          end
          count(q, 's', -1)
          count(q, 'w', 1)
        end
      elseif ty == 'hash' then
        -- (fk: a fair job claimed before, due again after its retry's delay: it waits
        -- in its key's lane, common/bookkeeping.lua push_waiting.)
        local r = rcall('HMGET', jk, 's', 'p', 'q', 'fk')
        if r[1] == 's' and (not r[3] or r[3] == q) then
          rcall('HSET', jk, 's', 'w', 'o', order + i)
          prio, fk = sane_prio(r[2]), r[4]
        end
      end
      if prio then
        push_waiting(q, prio, id, false, fk)
        count(q, 's', -1)
        count(q, 'w', 1)
      end
    end
    rcall('ZREM', sk, unpack(due))
  end
end

-- The best non-empty priority level of a queue: its priority and list key.
function claim_ops.head_of(q)
  while true do
    local t = rcall('ZRANGE', k_levels(q), '0', '0')
    if #t == 0 then return nil end
    local lk = k_wait(q, t[1])
    if rcall('TYPE', lk).ok == 'list' then return t[1], lk end
    rcall('ZREM', k_levels(q), t[1])
  end
end

-- The enqueue time of a level's head job, for comparing queues (each queue numbers
-- its own jobs, so their orders do not compare). Stale entries at the head are popped
-- first: nil when the list ran empty. An entry with no readable job compares as
-- oldest (activate decides).
function claim_ops.head_order(c, q, prio, lk)
  while c.pops < c.max_pops do
    local id = rcall('LINDEX', lk, -1)
    if not id then return nil end
    if string.byte(id, 1) == 126 then
      -- A fair key's marker: its lane's head job's enqueue time.
      local _, _, g = marker_parts(id)
      local lid = g and rcall('LINDEX', k_lane(q, g, prio), -1)
      local r = lid and read_keyed(q, lid, 'e')
      return r and tonumber(r[1]) or 0
    elseif not is_bare(id) then
      local f = parse_entry(id)
      if f and entry_live(q, prio, f) then return tonumber(f.e) or 0 end
    elseif not take_stale(q, prio, id) then
      local r = read_keyed(q, id, 's', 'q', 'p', 'e')
      if not r then return 0 end
      if r[1] == 'w' and (not r[2] or r[2] == q) and sane_prio(r[3]) == prio then
        return tonumber(r[4]) or 0
      end
    end
    rcall('RPOP', lk)
    c.pops = c.pops + 1
  end
  return 0
end

-- The best level of one queue with a live head (priority, list key, head order), for
-- comparing queues in a claim over several (one queue pops its best level directly).
function claim_ops.live_head(c, q)
  while true do
    local prio, lk = claim_ops.head_of(q)
    if not prio then return nil end
    local o = claim_ops.head_order(c, q, prio, lk)
    if o then return prio, lk, o end
  end
end

-- Claim the entry `id` popped from level `prio` of queue q (from a fair key's lane when
-- `laned`: the marker's '<weight>|<task>|<key>', which the claimed hash keeps as 'fk' so
-- that a retry or hand-back goes back to that lane), or drop it when its job left. A fair key's marker takes the key's turn:
-- returned is the marker to put back at the head when the claim ran out of room
-- mid-turn (see take_turn); nil otherwise.
function claim_ops.activate(c, id, q, prio, laned)
  local out = c.out
  if not is_bare(id) then
    -- A waiting entry (see keys.py) claimed: its index entry goes, its job becomes the hash.
    -- (Its fields as locals, not parse_entry's table: one table fewer per job.)
    local eid, o, e, r, m = entry_parts(id)
    if not eid then
      c.other = true  -- (claim.lua: not a waiting entry)
      if string.byte(id, 1) == 126 then return claim_ops.take_turn(c, q, prio, id) end  -- '~'
      return
    end
    -- Live: the index holds its order and level (entry_live's check, without its table).
    local ik = k_idx(q, eid)
    if rcall('HGET', ik, eid) ~= (prio == '0' and o or o .. '|' .. prio) then
      return  -- a job that left: dropped
    end
    local id, slot = eid, nil
    if c.has_limits then
      local ok
      ok, slot = claim_ops.admit(c, id, q, prio, m)
      if not ok then
        -- Parked: a gate lists '<prio>|<id>', so the job keeps a job string meanwhile.
        rcall('HDEL', ik, id)
        rcall('SET', k_job(q, id), pack_rec({s = 'w', o = o, e = e,
          p = prio ~= '0' and prio, r = r, m = m}))
        return
      end
    end
    rcall('HDEL', ik, id)
    c.claimed = c.claimed + 1
    local tok = c.tok_prefix .. count_text(c.claimed)
    if prio == '0' and not slot and not r then
      -- The common case, without a table of the fields and its unpack.
      rcall('HSET', k_job(q, id), 'm', m, 'q', q, 's', 'a', 'o', o, 'e', e, 'a', '1',
        't', tok, 'st', last_now_text, 'w', c.worker)
    else
      local fields = {'m', m, 'q', q, 's', 'a', 'o', o, 'e', e, 'a', '1', 't', tok,
        'st', last_now_text, 'w', c.worker}
      if prio ~= '0' then fields[#fields + 1] = 'p'; fields[#fields + 1] = prio end
      if slot then fields[#fields + 1] = 'ck'; fields[#fields + 1] = slot end
      if r then fields[#fields + 1] = 'r'; fields[#fields + 1] = r end
      rcall('HSET', k_job(q, id), unpack(fields))
    end
    local n = #out
    out[n + 1], out[n + 2], out[n + 3] = id, m, tok
    -- (The enqueue and due times as the entry's digits: the client reads either a
    -- number or its text, and a tonumber of 16 digits costs ~2k instructions.)
    out[n + 4], out[n + 5], out[n + 6], out[n + 7] = 1, e, 0, q
    out[n + 8] = r or 0
    c.one_line = claimed_job(q, id, c.lease_until, c.leases, c.ids, c.bare)
    return
  end
  c.other = true  -- (claim.lua: not a waiting entry)
  -- A counted stale entry (the job left waiting, maybe came back under this id):
  -- consumed and skipped, so the job is claimed only through its live entry.
  if take_stale(q, prio, id) then return end
  local jk = k_job(q, id)
  local ty = rcall('TYPE', jk).ok
  if ty == 'none' then return end  -- an id with no job behind it: dropped
  local f
  if ty == 'hash' then
    local r = rcall('HMGET', jk, 's', 'q', 'm', 'a', 'e', 'k', 'p', 'r', 'fl', 'fq', 'fx')
    -- A stale entry: the job left waiting meanwhile (or waits in another queue or
    -- at another priority level).
    if r[1] ~= 'w' or (r[2] and r[2] ~= q) or sane_prio(r[7]) ~= prio then return end
    -- A job of a flow whose end is under way (flow_end's chunks) ends instead of
    -- starting. It counts as 10 pops: a claim ends ~100 of them at most (~2.5 ms), not
    -- max_pops (claim.lua stops a batch there and puts the rest back).
    if r[9] and flow_ops.claim_ended(q, id, r[9], r[10] or q, r[11] == '1', r[4], c.now) then
      c.pops = c.pops + 9
      return
    end
    if not laned and claim_ops.divert(c, q, prio, id, r[3], nil, jk) then return end
    local slot
    if c.has_limits then
      local ok
      ok, slot = claim_ops.admit(c, id, q, prio, r[3] or '')
      if not ok then return end
    end
    c.claimed = c.claimed + 1
    local attempt = (tonumber(r[4]) or 0) + 1
    local tok = c.tok_prefix .. count_text(c.claimed)
    rcall('HSET', jk, 's', 'a', 'a', attempt, 't', tok, 'st', last_now_text, 'w', c.worker)
    if slot then rcall('HSET', jk, 'ck', slot) end
    if laned then rcall('HSET', jk, 'fk', laned) end
    local n = #out
    out[n + 1], out[n + 2], out[n + 3] = id, r[3] or '', tok
    out[n + 4], out[n + 5], out[n + 6], out[n + 7] = attempt, tonumber(r[5]) or 0, tonumber(r[6]) or 0, q
    out[n + 8] = tonumber(r[8]) or 0
  else
    if ty == 'string' then
      local raw = rcall('GET', jk)
      f = parse_rec(raw, q)
      if f and (f.s ~= 'w' or f.q ~= q or sane_prio(f.p) ~= prio) then return end  -- stale
      -- Bytes that are not a job: keep them as the job's body, so the worker fails
      -- this job with reason decode_error instead of losing it. (They most likely
      -- replaced a counted waiting job, so the counts stay as they are.)
      if not f then f = {s = 'w', q = q, o = 0, e = c.now, p = false, r = false, m = raw} end
    else
      f = {s = 'w', q = q, o = 0, e = c.now, p = false, r = false, m = ''}
    end
    if not laned and claim_ops.divert(c, q, prio, id, f.m, f.o) then return end
    local slot
    if c.has_limits then
      local ok
      ok, slot = claim_ops.admit(c, id, q, prio, f.m)
      if not ok then return end
    end
    c.claimed = c.claimed + 1
    local tok = c.tok_prefix .. count_text(c.claimed)
    rcall('DEL', jk)
    local fields = rec_fields(f)
    local n = #fields
    fields[6] = 'a'  -- the state
    fields[n + 1], fields[n + 2], fields[n + 3], fields[n + 4] = 'a', '1', 't', tok
    fields[n + 5], fields[n + 6], fields[n + 7], fields[n + 8] = 'st', last_now_text, 'w', c.worker
    n = n + 8
    if slot then fields[n + 1], fields[n + 2] = 'ck', slot; n = n + 2 end
    if laned then fields[n + 1], fields[n + 2] = 'fk', laned end
    rcall('HSET', jk, unpack(fields))
    n = #out
    out[n + 1], out[n + 2], out[n + 3] = id, f.m, tok
    out[n + 4], out[n + 5], out[n + 6], out[n + 7] = 1, tonumber(f.e) or 0, 0, q
    out[n + 8] = tonumber(f.r) or 0
  end
  c.one_line = claimed_job(q, id, c.lease_until, c.leases, c.ids, c.bare)
end

-- A job id taken from its fair key's lane (`fk`: the marker's '<weight>|<task>|<key>'):
-- the usual one, a waiting job string of this queue and level, is read and deleted in
-- one GETDEL (no TYPE first) and claimed here without a table of its fields; any other
-- (a job hash: retried or handed back; a claim with limits; a stale or foreign string,
-- put back as it was) is activate's.
function claim_ops.claim_laned(c, id, q, prio, fk)
  -- (A lane holds job ids, which hold no '|', and '|', a removed job's entry.)
  if id == '|' then return end
  if c.has_limits then return claim_ops.activate(c, id, q, prio, fk) end
  if stale_any[q] ~= false and take_stale(q, prio, id) then return end
  local jk = k_job(q, id)
  local raw = rpcall('GETDEL', jk)
  if type(raw) ~= 'string' then
    if not raw then return end  -- an id with no job behind it: dropped
    return claim_ops.activate(c, id, q, prio, fk)  -- not a string (WRONGTYPE): a hash, or bytes
  end
  local s, rq, o, e, p, r, at = string.match(raw, '^([ws])([^|]*)|(%d+)|(%d+)|(%-?%d*)|(%d*)|()')
  if s ~= 'w' or (rq ~= '' and rq ~= q) or (p ~= '' and p ~= prio) or (p == '' and prio ~= '0') then
    rcall('SET', jk, raw)
    return claim_ops.activate(c, id, q, prio, fk)
  end
  local m = string.sub(raw, at)
  local claimed = c.claimed + 1
  c.claimed = claimed
  local tok, worker = c.tok_prefix .. count_text(claimed), c.worker
  if p == '' and r == '' then
    rcall('HSET', jk, 'm', m, 'q', q, 's', 'a', 'o', o, 'e', e, 'a', '1', 't', tok,
      'st', last_now_text, 'w', worker, 'fk', fk)
  elseif r == '' then
    rcall('HSET', jk, 'm', m, 'q', q, 's', 'a', 'o', o, 'e', e, 'a', '1', 't', tok,
      'st', last_now_text, 'w', worker, 'fk', fk, 'p', p)
  elseif p == '' then
    rcall('HSET', jk, 'm', m, 'q', q, 's', 'a', 'o', o, 'e', e, 'a', '1', 't', tok,
      'st', last_now_text, 'w', worker, 'fk', fk, 'r', r)
  else
    rcall('HSET', jk, 'm', m, 'q', q, 's', 'a', 'o', o, 'e', e, 'a', '1', 't', tok,
      'st', last_now_text, 'w', worker, 'fk', fk, 'p', p, 'r', r)
  end
  local out = c.out
  local n = #out
  out[n + 1], out[n + 2], out[n + 3] = id, m, tok
  out[n + 4], out[n + 5], out[n + 6], out[n + 7] = 1, e, 0, q  -- (digits: see activate)
  out[n + 8] = r ~= '' and r or 0
  c.one_line = claimed_job(q, id, c.lease_until, c.leases, c.ids, c.bare)
end

-- A fair key's turn (its marker `v` popped from level `prio` of `q`): up to its weight
-- of jobs from its lane, while this claim has room. Returns the marker to put back at
-- the head when the claim ran out of room mid-turn (the caller pushes it last, so it
-- is first out); else the marker goes back to the tail (jobs left: into c.tails, which
-- the claim loop pushes in one LPUSH after each pop, in order: claim_ops.push_tails)
-- or away (none).
function claim_ops.take_turn(c, q, prio, v)
  -- (Text captures, no numbers: a number made text again costs a format. The usual
  -- marker, a new turn of weight 1, is cut, not matched.)
  local ts, fk, taken, weight, group
  if string.sub(v, 1, 5) == '~0|1|' and #v > 5 then
    ts, fk, taken, weight, group = '0', string.sub(v, 4), 0, 1, string.sub(v, 6)
  else
    local ws
    ts, fk, ws, group = string.match(v, '^~(%d+)|((%d+)|(.+))$')
    if not ts then return nil end
    taken, weight = tonumber(ts), tonumber(ws)
  end
  -- A new turn takes the key's newest job's weight: when a new job changed it since
  -- the marker was written, the lane is in FC and the F hash has it (lane_push). One
  -- EXISTS per queue and claim while no weight changed (c.fc: queue -> FC exists).
  if ts == '0' and claim_ops.weights_changed(c, q) then
    local field = prio .. '|' .. group
    if rcall('SREM', k_lanes(q, true), field) == 1 then
      local w = tonumber(rcall('HGET', k_lanes(q), field))
      if w and w >= 1 then
        weight = w
        fk = int_text(w) .. '|' .. group
        v = '~0|' .. fk
      end
    end
  end
  local lk = k_lane(q, group, prio)
  local left = true
  while taken < weight and c.claimed < c.limit and c.pops < c.max_pops do
    -- As many as the turn and the claim have room for, in one RPOP (a stale id among
    -- them takes its place in the turn, as on the embedded broker); one is popped
    -- without a count (its answer is the id, not a table of it).
    local want = math.min(weight - taken, c.limit - c.claimed, c.max_pops - c.pops)
    if want == 1 then
      local id = rpcall('RPOP', lk)
      if type(id) ~= 'string' then left = false; break end
      c.pops, taken = c.pops + 1, taken + 1
      claim_ops.claim_laned(c, id, q, prio, fk)
    else
      local ids = rpcall('RPOP', lk, num_text(want))
      if type(ids) ~= 'table' or ids.err then ids = {} end
      for _, id in ipairs(ids) do
        c.pops, taken = c.pops + 1, taken + 1
        claim_ops.claim_laned(c, id, q, prio, fk)
      end
      if #ids < want then left = false; break end
    end
  end
  if left and rcall('EXISTS', lk) == 0 then left = false end
  if not left then
    -- The lane goes, and its weight with it (bounded by the keys with jobs waiting).
    local field = prio .. '|' .. group
    rcall('HDEL', k_lanes(q), field)
    if claim_ops.weights_changed(c, q) then rcall('SREM', k_lanes(q, true), field) end
    return nil
  end
  if taken < weight then
    rcall('ZADD', k_levels(q), level_score(prio), prio)
    return '~' .. taken .. '|' .. fk
  end
  -- Back at the tail (a marker that began its turn at 0 is the same text again).
  if ts ~= '0' then v = '~0|' .. fk end
  local tails = c.tails
  if not tails then
    tails = {}
    c.tails = tails
  end
  tails[#tails + 1] = v
  return nil
end

-- Does queue `q` have fair lanes whose weight changed (FC, see lane_push)? Read once
-- per queue and claim call (c.fc), at its first fair turn.
function claim_ops.weights_changed(c, q)
  local fc = c.fc
  if not fc then
    fc = {}
    c.fc = fc
  end
  local has = fc[q]
  if has == nil then
    has = rcall('EXISTS', k_lanes(q, true)) == 1
    fc[q] = has
  end
  return has
end

-- The markers of the turns that ended with jobs left (take_turn's c.tails), pushed at
-- the tail of level `prio` of `q` (the list `lk` the claim loop popped them from) in
-- one LPUSH, in turn order; a level list this claim emptied (and unlisted) is listed
-- again.
function claim_ops.push_tails(c, q, prio, lk)
  local tails = c.tails
  if not tails or #tails == 0 then return end
  if rcall('LPUSH', lk, unpack(tails)) == #tails then
    rcall('ZADD', k_levels(q), level_score(prio), prio)
  end
  c.tails = nil
end

-- A fair job (`body`; its order `o`, or its hash `jk` to read it from) popped from its
-- level list: it joins its key's lane. A key with
-- no job waiting takes its turn now, where the job stood in the line. Returns true when
-- the job was fair (moved, or claimed by its turn), false for any other job.
function claim_ops.divert(c, q, prio, id, body, o, jk)
  local group, weight = fair_of(body)
  if not group then return false end
  if jk then o = rcall('HGET', jk, 'o') end  -- (a job hash's order, read only for a fair one)
  local lk = k_lane(q, group, prio)
  local head = rcall('LINDEX', lk, -1)
  if head then
    -- The key has jobs waiting: a job older than its lane's head (one claimed by a
    -- typedq before 'fk' and handed back: its old place) goes first, any other at the
    -- tail. (A hand-back of a job with 'fk' never comes here: push_back_in_order.)
    local r = read_keyed(q, head, 'o')
    if r and tonumber(o) and tonumber(r[1]) and tonumber(o) < tonumber(r[1]) then
      rcall('RPUSH', lk, id)
    else
      rcall('LPUSH', lk, id)
    end
    return true
  end
  rcall('LPUSH', lk, id)
  rcall('HSET', k_lanes(q), prio .. '|' .. group, weight)
  local back = claim_ops.take_turn(c, q, prio, '~0|' .. weight .. '|' .. group)
  if back then rcall('RPUSH', k_wait(q, prio), back) end
  return true
end

-- When the next job of the queues args[first .. last] is due, in µs from now (nil:
-- none is scheduled): the earliest scheduled job, or gate opening of a queue in `gated`.
-- `known` (a claim of one queue): its scheduled set's head as promote_due read it in this
-- call (false: empty; nil: not known, read here).
function claim_ops.next_due(args, first, last, gated, now, known)
  local next_due = nil
  if known ~= nil then
    next_due = known or nil
  else
    for qi = first, last do
      local q = args[qi]
      local t = rcall('ZRANGE', k_sched(q), '0', '0', 'WITHSCORES')
      if #t > 0 and (not next_due or tonumber(t[2]) < next_due) then next_due = tonumber(t[2]) end
    end
  end
  for qi = first, last do
    local q = args[qi]
    if gated and gated[q] then
      local t = rcall('ZRANGE', k_gates(q), '0', '0', 'WITHSCORES')
      local opens = #t > 0 and tonumber(t[2])
      if opens and opens < math.huge and (not next_due or opens < next_due) then
        next_due = opens
      end
    end
  end
  if next_due then return math.max(0, next_due - now) end
  return nil
end
