#!lua flags=allow-oom
-- Claim up to `limit` due jobs across queues: highest priority first, then oldest.
-- Promotes due scheduled jobs first. Each claimed job gets the token
-- '<claim token>.<i>'; the claim token is chosen by the client per claim, and the
-- claim is recorded under that token (not under the worker: one worker has several
-- claims in flight), so a re-sent claim (lost reply, client retry) returns the same
-- jobs instead of claiming more. Runs at maxmemory (allow-oom): draining frees memory.
-- KEYS[1] = the first queue's active zset, KEYS[2] = its order counter, KEYS[3] = this
-- claim's record (on the first queue's slot; lines '<queue>|<id>'). On Redis Cluster a
-- claim names one queue; on standalone Redis one claim may take from several.
-- ARGV: P, limit, lease_us, claim token, worker id, nq, queues...,
--       [nl, then nl x (task, rate, per_us, concurrency, spacing_us, early_us),
--        [ns, then ns x (queue, completed_ttl_us, completed_max, n, n x (id, token, result))]]
-- Returns {next_due_us (-1: nothing scheduled), then per job: id, body, token,
--          attempt, enqueued_at_us, stalls, queue, due_us (0: due since its enqueue or by
--          its body's eta/delay; set when it became due again: a retry, hand-back, ...)}
-- With a settle section (ns > 0: the worker's completions, whose slots this claim
-- refills): those jobs are completed first, as complete.lua does, and the answer is
-- {the claim's answer as above, {outcome per completion, in order}}. One script per
-- job in a worker's steady state instead of two.
-- A claimed waiting entry or job string (see keys.py) becomes the job hash.
--
-- Limits (typedq/limits.py), only when the caller names tasks with limits (nl > 0;
-- otherwise none of this runs): a popped job whose task is limited is admitted only
-- if its concurrency bucket has a free slot and its rate bucket's window holds fewer
-- than `rate` starts (a sliding-window log on this clock); else it is parked by that gate, still waiting, and the claim goes on
-- with the jobs behind it. Open gates give their parked jobs back to the waiting
-- lists (at their old place) before the claim pops; the answer's next_due includes
-- the earliest gate opening, so the worker sleeps exactly until then.
local limit, lease, token, worker, nq =
  tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5], tonumber(ARGV[6])
if not is_int(limit) or limit < 0 or not lease or lease <= 0 or token == ''
    or not is_int(nq) or nq < 1 or #ARGV < 6 + nq then
  return bad_args('claim')
end
-- The queues are ARGV[7 .. 6 + nq] (read there: no table of them per call).
for qi = 7, 6 + nq do
  if ARGV[qi] == '' then return bad_args('claim') end
end
-- task -> {rate, per_us, concurrency}: made only for a claim with a limits section or a
-- queue with gates (most claims have neither).
local cfg, has_limits = nil, false
-- Per settled queue, five entries: queue, ttl, cap, its first item's ARGV index, n (one
-- flat table, not one per queue: a call makes fewer tables).
local settles = nil
if #ARGV > 6 + nq then
  local base = 7 + nq
  local nl = tonumber(ARGV[base])
  if not is_int(nl) or nl < 0 or #ARGV < base + 6 * nl then return bad_args('claim') end
  local at = base + 6 * nl + 1
  if #ARGV >= at then
    local ns = tonumber(ARGV[at])
    if not is_int(ns) or ns < 0 then return bad_args('claim') end
    settles, at = {}, at + 1
    for _ = 1, ns do
      local sq, ttl, cap, n = ARGV[at], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]),
        tonumber(ARGV[at + 3])
      if not sq or sq == '' or not ttl or not is_int(cap) or not is_int(n) or n < 0 then
        return bad_args('claim')
      end
      local g = #settles
      settles[g + 1], settles[g + 2], settles[g + 3], settles[g + 4], settles[g + 5] =
        sq, ttl, cap, at + 4, n
      at = at + 4 + 3 * n
    end
    if #ARGV ~= at - 1 then return bad_args('claim') end
  end
  for i = 0, nl - 1 do
    local b = base + 1 + 6 * i
    local rate, per, cc = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
    local gap, early = tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
    if ARGV[b] == '' or not is_int(rate) or rate < 0 or not is_int(per) or per < 0
        or (rate > 0 and per < 1) or not is_int(cc) or cc < 0 or not is_int(gap) or gap < 0
        or gap > per or not is_int(early) or early < 0 or early > per then
      return bad_args('claim')
    end
    cfg = cfg or {}
    cfg[ARGV[b]] = {rate, per, cc, gap, early}
    has_limits = true
  end
end

local now = now_us()
local out = {-1}

-- The completions first (their slots are what this claim fills). A re-sent call answers
-- them ALREADY_FINISHED and its claim's jobs below, like a re-sent pipeline of both.
local settled = nil
if settles then
  settled = {}
  local total = 0
  for g = 5, #settles, 5 do total = total + settles[g] end
  batch_zsets(total > 1)  -- one write per sorted set, not per job (common/bookkeeping.lua)
  for g = 1, #settles, 5 do
    local sq, b, n = settles[g], settles[g + 3], settles[g + 4]
    for i = 0, n - 1 do
      local a = b + 3 * i
      settled[#settled + 1] = complete_one(sq, ARGV[a], ARGV[a + 1], ARGV[a + 2], now)
    end
    trim(sq, 'c', now, settles[g + 1], settles[g + 2], n + 100)
  end
end

-- A claim that came up short (took fewer than `limit` jobs): its worker is about to wait
-- for work, so each of its queues gets its waiter mark (common/bookkeeping.lua's publish), in this
-- script, which found nothing more to claim: whatever gives them work later publishes.
-- Not for a refill (a claim with a settle section): the worker's own claim, which came
-- up short before its worker waits, set the marks that wait needs; a short refill
-- leaves slots free, and the worker claims for them (and marks) before it waits.
-- (mark_waiters: common/bookkeeping.lua; the queues are ARGV[7 .. 6 + nq].)

-- A re-sent claim: hand back what the first copy claimed (still ours), nothing new.
local prev = rpcall('GET', KEYS[3])
if type(prev) == 'string' and string.sub(prev, 1, #token + 1) == token .. '\n' then
  local prefix = token .. '.'
  for line in string.gmatch(string.sub(prev, #token + 2), '[^\n]+') do
    local q, id = string.match(line, '^([^|]*)|(.*)$')
    local r = q and read_hash(q, id, 's', 't', 'm', 'a', 'e', 'k', 'q', 'r')
    if r and r[1] == 'a' and r[2] and string.sub(r[2], 1, #prefix) == prefix then
      local n = #out
      out[n + 1], out[n + 2], out[n + 3] = id, r[3] or '', r[2]
      out[n + 4], out[n + 5], out[n + 6] = tonumber(r[4]) or 1, tonumber(r[5]) or 0, tonumber(r[6]) or 0
      out[n + 7] = r[7] or q
      out[n + 8] = tonumber(r[8]) or 0
    end
  end
  -- Short: the worker waits after this answer (a notice that consumed the first copy's
  -- mark may have come before this copy was sent, which is what its wait counts from).
  if not settles and (#out - 1) / 8 < limit then mark_waiters(ARGV, 7, 6 + nq) end
  if settled then return settle_answer(out, settled) end
  return out
end

-- Promote due scheduled jobs (bounded per call; the rest next time). A promoted job keeps
-- its due time 'r': its queue wait counts from it.
for qi = 7, 6 + nq do
  local q = ARGV[qi]
  local sk = k_sched(q)
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

-- Which queues have gates (parked jobs): a claim without limits looks too (one EXISTS
-- per queue), so after a deploy that dropped a limit its parked jobs still come back.
-- (gated: queue -> true, made only when a queue is gated.)
local gated, any_gated = nil, false
for qi = 7, 6 + nq do
  local q = ARGV[qi]
  if has_limits or rcall('EXISTS', k_gates(q)) == 1 then
    gated = gated or {}
    gated[q], any_gated = true, true
  end
end

-- The limit helpers (admit, allowance), made only when this claim limits tasks or a
-- queue has gates: most claims have neither and skip making a dozen closures.
local admit, allowance
if any_gated then
  cfg = cfg or {}
  -- Limits. A job body is a msgpack array [task, payload, fingerprint, priority,
  -- max_retries, timeout, eta, delay, rate_key, concurrency_key] with trailing defaults
  -- left out (see redis/codec.py). Redis' cmsgpack cannot read msgpack bin values (the
  -- payload), so the few fields needed are read here by skipping over the others.
  local function mp_uint(s, i, n)
    local v = 0
    for k = i, i + n - 1 do v = v * 256 + (string.byte(s, k) or 0) end
    return v
  end

  -- The offset after the scalar at `i` (nil: not a scalar a body holds).
  local function mp_skip(s, i)
    local b = string.byte(s, i)
    if not b then return nil end
    if b <= 0x7f or b >= 0xe0 or b == 0xc0 or b == 0xc2 or b == 0xc3 then return i + 1 end
    if b >= 0xa0 and b <= 0xbf then return i + 1 + b - 0xa0 end
    if b == 0xc4 or b == 0xd9 then return i + 2 + mp_uint(s, i + 1, 1) end
    if b == 0xc5 or b == 0xda then return i + 3 + mp_uint(s, i + 1, 2) end
    if b == 0xc6 or b == 0xdb then return i + 5 + mp_uint(s, i + 1, 4) end
    if b == 0xcc or b == 0xd0 then return i + 2 end
    if b == 0xcd or b == 0xd1 then return i + 3 end
    if b == 0xca or b == 0xce or b == 0xd2 then return i + 5 end
    if b == 0xcb or b == 0xcf or b == 0xd3 then return i + 9 end
    return nil
  end

  -- The string at `i` and the offset after it (nil: not a string).
  local function mp_str(s, i)
    local b = string.byte(s, i)
    if not b then return nil end
    local len, at
    if b >= 0xa0 and b <= 0xbf then len, at = b - 0xa0, i + 1
    elseif b == 0xd9 then len, at = mp_uint(s, i + 1, 1), i + 2
    elseif b == 0xda then len, at = mp_uint(s, i + 1, 2), i + 3
    else return nil end
    return string.sub(s, at, at + len - 1), at + len
  end

  -- The task, its limits, the rate key and the concurrency key of a job body; nil for a
  -- task this claim does not limit. A limited body whose keys cannot be read uses the
  -- task-wide buckets ('').
  local function limits_of(body)
    local b = string.byte(body, 1)
    if not b then return nil end
    local n, i
    if b >= 0x90 and b <= 0x9f then n, i = b - 0x90, 2
    elseif b == 0xdc then n, i = mp_uint(body, 2, 2), 4
    else return nil end
    if n < 1 then return nil end
    local task
    task, i = mp_str(body, i)
    local c = task and cfg[task]
    if not c then return nil end
    local keys = {'', ''}
    if n >= 9 then
      for _ = 2, 8 do
        i = i and mp_skip(body, i)
      end
      for k = 1, math.min(n - 8, 2) do
        local v
        if i then v, i = mp_str(body, i) end
        keys[k] = v or ''
      end
    end
    return task, c, keys[1], keys[2]
  end

  -- A gate gives its parked jobs back from its tail, so it keeps them best first from
  -- there, as the levels are: an entry goes behind every parked one of its priority or
  -- higher (the embedded broker keeps a heap). Usually that is the head (LPUSH); a job
  -- of a higher priority than the head's looks through at most PARK_SCAN entries.
  local PARK_SCAN = 1000
  local function park(q, gate, prio, id, opens)
    local lk, entry, p = k_gate(q, gate), prio .. '|' .. id, tonumber(prio)
    local head = rcall('LINDEX', lk, 0)
    local hp = head and tonumber(string.match(head, '^(%-?%d+)|'))
    if not hp or hp >= p then
      rcall('LPUSH', lk, entry)
    else
      local rows, placed = rcall('LRANGE', lk, 0, PARK_SCAN - 1), false
      for i = 2, #rows do
        local rp = tonumber(string.match(rows[i], '^(%-?%d+)|'))
        if rp and rp >= p then
          rcall('LINSERT', lk, 'BEFORE', rows[i], entry)  -- behind it, toward the head
          placed = true
          break
        end
      end
      if not placed then
        -- The best parked (all looked at), else past the scan: near enough, at the head.
        if #rows < PARK_SCAN then rcall('RPUSH', lk, entry) else rcall('LPUSH', lk, entry) end
      end
    end
    rcall('HSET', k_parked(q), id, gate)
    rcall('ZADD', k_gates(q), opens, gate)
  end

  -- A rate bucket's starts in (now - per, now], counted once per claim (older ones go).
  local windows, expiring = {}, {}
  local function window(rkey, per)
    local n = windows[rkey]
    if not n then
      rcall('ZREMRANGEBYSCORE', rkey, '-inf', string.format('%d', now - per))
      n = rcall('ZCARD', rkey)
      windows[rkey] = n
    end
    return n
  end

  -- How many slots of a concurrency bucket are held, read once per claim; ghosts of
  -- deleted active jobs whose lease has ended leave first (common/finish.lua's ghost_slot).
  local holders = {}
  local function held(q, slot)
    local sk = k_slots(q, slot)
    local n = holders[sk]
    if not n then
      local gz = sk .. ':g'
      local ended = rcall('ZRANGEBYSCORE', gz, '-inf', now)
      if #ended > 0 then
        rcall('SREM', sk, unpack(ended))
        rcall('ZREMRANGEBYSCORE', gz, '-inf', now)
      end
      n = rcall('SCARD', sk)
      holders[sk] = n
    end
    return n
  end

  -- When a full concurrency bucket frees a slot by itself: its first ghost's end (none:
  -- '+inf', a running job's settle opens the gate).
  local function ghost_ends(q, slot)
    local g = rcall('ZRANGE', k_slots(q, slot) .. ':g', 0, 0, 'WITHSCORES')
    if #g == 0 then return '+inf' end
    return g[2]
  end

  -- When a full window (n >= rate starts) opens: once the start `rate` places back leaves.
  local function window_opens(rkey, n, rate, per)
    local t = rcall('ZRANGE', rkey, n - rate, n - rate, 'WITHSCORES')
    if #t == 0 then return now end
    return tonumber(t[2]) + per
  end

  -- The bucket's next turn: `gap` after its last start's turn (spaced starts,
  -- typedq.limits RateLimit.spacing_us; gap <= per, so the last one is in the window),
  -- and never before now. A start is recorded at its turn, which may be up to `early`
  -- after now.
  local function next_turn(rkey, n, gap)
    if gap == 0 or n == 0 then return now end
    local t = rcall('ZRANGE', rkey, -1, -1, 'WITHSCORES')
    if #t == 0 then return now end
    return math.max(now, tonumber(t[2]) + gap)
  end

  -- Admit a job (take its place in the rate window and a concurrency slot) or park it by
  -- its closed gate: concurrency first, then rate. Returns admitted, and the slot it holds.
  admit = function(id, q, prio, body)
    local task, c, rk, ck = limits_of(body)
    if not task then return true, nil end
    local slot
    if c[3] > 0 then
      slot = task .. '|' .. ck
      if held(q, slot) >= c[3] then
        park(q, 'c|' .. slot, prio, id, ghost_ends(q, slot))
        return false, nil
      end
    end
    if c[1] > 0 then
      local rkey = k_rate(q, task, rk)
      local n = window(rkey, c[2])
      if n >= c[1] then
        park(q, 'r|' .. task .. '|' .. rk, prio, id, window_opens(rkey, n, c[1], c[2]))
        return false, nil
      end
      local turn = next_turn(rkey, n, c[4])
      if turn > now + c[5] then
        park(q, 'r|' .. task .. '|' .. rk, prio, id, turn - c[5])
        return false, nil
      end
      local at = string.format('%d', turn)
      rcall('ZADD', rkey, at, id .. '@' .. at)
      if not expiring[rkey] then
        expiring[rkey] = true
        -- Once its last start leaves the window, a bucket is as good as new: it expires
        -- (set once per bucket and claim: all of this claim's starts share `now`).
        rcall('PEXPIRE', rkey, math.floor((c[2] + c[5]) / 1000) + 1)
      end
      windows[rkey] = n + 1
    end
    if slot then
      local sk = k_slots(q, slot)
      rcall('SADD', sk, id)
      holders[sk] = holders[sk] + 1
    end
    return true, slot
  end

  -- How many jobs an open gate's bucket admits now (nil: this claim does not limit its
  -- task), and when it opens next.
  allowance = function(q, gate)
    local kind, task, key = string.match(gate, '^([rc])|([^|]*)|(.*)$')
    local c = task and cfg[task]
    if not c then return nil end
    if kind == 'c' then
      if c[3] == 0 then return nil end
      local slot = task .. '|' .. key
      return math.max(0, c[3] - held(q, slot)), ghost_ends(q, slot)
    end
    if c[1] == 0 then return nil end
    local rkey = k_rate(q, task, key)
    local n = window(rkey, c[2])
    if n >= c[1] then return 0, window_opens(rkey, n, c[1], c[2]) end
    if c[4] > 0 then
      -- Spaced: the turns from the next one to now + early.
      local turn = next_turn(rkey, n, c[4])
      if turn > now + c[5] then return 0, turn - c[5] end
      return math.min(c[1] - n, math.floor((now + c[5] - turn) / c[4]) + 1), now
    end
    return c[1] - n, now
  end
end

-- Open gates give back as many parked jobs as their bucket admits (bounded by this
-- claim's limit), at their old place among the waiting jobs; a gate whose bucket is
-- still closed gets its true opening time. A claim without limits looks too (one
-- EXISTS per queue): after a deploy that dropped a limit, its parked jobs still come
-- back (a gate of a task this claim does not limit gives back as many as it asks for).
if any_gated and limit > 0 then
  for qi = 7, 6 + nq do
    local q = ARGV[qi]
    local gk = k_gates(q)
    local open = gated[q] and rcall('ZRANGEBYSCORE', gk, '-inf', now, 'LIMIT', 0, 64) or {}
    for _, gate in ipairs(open) do
      local lk = k_gate(q, gate)
      local n, opens = allowance(q, gate)
      if n == nil or n > limit then n = limit end
      if n == 0 then
        rcall('ZADD', gk, opens, gate)
      else
        local back = {}
        -- A counted stale entry (its job was cancelled or removed while parked) is
        -- consumed here and admits nothing: the gate gives back another in its place.
        local popped, want = {}, n
        while want > 0 do
          local got = rcall('RPOP', lk, want)
          if not got then break end
          want = 0
          for _, e in ipairs(got) do
            local prio, id = string.match(e, '^(%-?%d+)|(.*)$')
            if prio and take_stale(q, prio, id) then want = want + 1
            else popped[#popped + 1] = e end
          end
        end
        for _, e in ipairs(popped) do
          local prio, id = string.match(e, '^(%-?%d+)|(.*)$')
          if prio then
            rcall('HDEL', k_parked(q), id)
            -- A job that left waiting meanwhile goes back as a dead entry, first (its
            -- cancel or remove counted it stale; whoever pops it consumes that).
            -- A fair job goes back into its key's lane (push_back_in_order): a hash
            -- names its key ('fk'), a job string's body does (lanes.lua fair_of).
            local r, ty = read_keyed(q, id, 's', 'q', 'p', 'o', 'fk', 'm')
            local order, fk = 0, nil
            if r and r[1] == 'w' and r[2] == q and sane_prio(r[3]) == prio then
              order, fk = tonumber(r[4]) or 0, r[5] or nil
              if not fk and ty == 'string' then
                local group, weight = fair_of(r[6])
                if group then fk = weight .. '|' .. group end
              end
            end
            back[#back + 1] = {id, q, prio, order, fk}
          end
        end
        push_back_in_order(back)
        if rcall('EXISTS', lk) == 0 then rcall('ZREM', gk, gate) end
      end
    end
  end
end

local claimed, pops = 0, 0
local max_pops = limit + 1000  -- stale entries are skipped, but not without bound

-- The best level of one queue with a live head (priority, list key, head order), for
-- comparing queues: made only for a claim over several queues (one queue pops its best
-- level directly, below), so a usual claim makes none of these closures.
local live_head
if nq > 1 then
  -- The best non-empty priority level of a queue: its priority and list key.
  local function head_of(q)
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
  local function head_order(q, prio, lk)
    while pops < max_pops do
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
      pops = pops + 1
    end
    return 0
  end

  live_head = function(q)
    while true do
      local prio, lk = head_of(q)
      if not prio then return nil end
      local o = head_order(q, prio, lk)
      if o then return prio, lk, o end
    end
  end
end
local lease_until = num_text(now + lease)
-- Every claimed job's token is '<claim token>.<i>'.
local tok_prefix = token .. '.'
-- The claim record's lines, '<queue>|<id>' per claimed job: a table for a claim of
-- several jobs, the one line itself for a claim of one (no table; claimed_job, common/bookkeeping.lua,
-- returns it).
local ids, one_line = limit > 1 and {} or nil, nil
-- A claim of several jobs puts their leases into each queue's active set in one ZADD at
-- the end, not one per job (nothing below reads the set): queue -> lease_until, id, ...
local leases = limit > 1 and {} or nil


-- Fair shares (common/lanes.lua): a marker popped takes its key's turn (take_turn); a
-- fair job popped from a level list (not from its lane) moves to its lane (divert).
local take_turn, divert
-- The markers of turns that ended with jobs left, to push back at the tail of the level
-- list being popped (take_turn; one LPUSH per pop of the claim loop, not one per turn).
local tails = {}

-- `laned`: the job came out of its fair key's lane: the marker's '<weight>|<task>|<key>'
-- (its claimed hash keeps it as 'fk': a retry or hand-back goes back to that lane).
local function activate(id, q, prio, laned)
  if not is_bare(id) then
    -- A waiting entry (see keys.py) claimed: its index entry goes, its job becomes the hash.
    -- (Here, not in a function of its own: one closure fewer per call. Its fields as
    -- locals, not parse_entry's table: one table fewer per job.)
    local eid, o, e, r, m = entry_parts(id)
    if not eid then
      if string.byte(id, 1) == 126 then return take_turn(q, prio, id) end  -- '~'
      return
    end
    -- Live: the index holds its order and level (entry_live's check, without its table).
    local ik = k_idx(q, eid)
    if rcall('HGET', ik, eid) ~= (prio == '0' and o or o .. '|' .. prio) then
      return  -- a job that left: dropped
    end
    local id, slot = eid, nil
    if has_limits then
      local ok
      ok, slot = admit(id, q, prio, m)
      if not ok then
        -- Parked: a gate lists '<prio>|<id>', so the job keeps a job string meanwhile.
        rcall('HDEL', ik, id)
        rcall('SET', k_job(q, id), pack_rec({s = 'w', o = o, e = e,
          p = prio ~= '0' and prio, r = r, m = m}))
        return
      end
    end
    rcall('HDEL', ik, id)
    claimed = claimed + 1
    local tok = tok_prefix .. count_text(claimed)
    if prio == '0' and not slot and not r then
      -- The common case, without a table of the fields and its unpack.
      rcall('HSET', k_job(q, id), 'm', m, 'q', q, 's', 'a', 'o', o, 'e', e, 'a', '1',
        't', tok, 'st', last_now_text, 'w', worker)
    else
      local fields = {'m', m, 'q', q, 's', 'a', 'o', o, 'e', e, 'a', '1', 't', tok,
        'st', last_now_text, 'w', worker}
      if prio ~= '0' then fields[#fields + 1] = 'p'; fields[#fields + 1] = prio end
      if slot then fields[#fields + 1] = 'ck'; fields[#fields + 1] = slot end
      if r then fields[#fields + 1] = 'r'; fields[#fields + 1] = r end
      rcall('HSET', k_job(q, id), unpack(fields))
    end
    local n = #out
    out[n + 1], out[n + 2], out[n + 3] = id, m, tok
    out[n + 4], out[n + 5], out[n + 6], out[n + 7] = 1, tonumber(e) or 0, 0, q
    out[n + 8] = r and tonumber(r) or 0
    one_line = claimed_job(q, id, lease_until, leases, ids)
    return
  end
  -- A counted stale entry (the job left waiting, maybe came back under this id):
  -- consumed and skipped, so the job is claimed only through its live entry.
  if take_stale(q, prio, id) then return end
  local jk = k_job(q, id)
  local ty = rcall('TYPE', jk).ok
  if ty == 'none' then return end  -- an id with no job behind it: dropped
  local f
  if ty == 'hash' then
    local r = rcall('HMGET', jk, 's', 'q', 'm', 'a', 'e', 'k', 'p', 'r')
    -- A stale entry: the job left waiting meanwhile (or waits in another queue or
    -- at another priority level).
    if r[1] ~= 'w' or (r[2] and r[2] ~= q) or sane_prio(r[7]) ~= prio then return end
    if not laned and divert(q, prio, id, r[3], nil, jk) then return end
    local slot
    if has_limits then
      local ok
      ok, slot = admit(id, q, prio, r[3] or '')
      if not ok then return end
    end
    claimed = claimed + 1
    local attempt = (tonumber(r[4]) or 0) + 1
    local tok = tok_prefix .. count_text(claimed)
    rcall('HSET', jk, 's', 'a', 'a', attempt, 't', tok, 'st', last_now_text, 'w', worker)
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
      if not f then f = {s = 'w', q = q, o = 0, e = now, p = false, r = false, m = raw} end
    else
      f = {s = 'w', q = q, o = 0, e = now, p = false, r = false, m = ''}
    end
    if not laned and divert(q, prio, id, f.m, f.o) then return end
    local slot
    if has_limits then
      local ok
      ok, slot = admit(id, q, prio, f.m)
      if not ok then return end
    end
    claimed = claimed + 1
    local tok = tok_prefix .. count_text(claimed)
    rcall('DEL', jk)
    local fields = rec_fields(f)
    local n = #fields
    fields[6] = 'a'  -- the state
    fields[n + 1], fields[n + 2], fields[n + 3], fields[n + 4] = 'a', '1', 't', tok
    fields[n + 5], fields[n + 6], fields[n + 7], fields[n + 8] = 'st', last_now_text, 'w', worker
    n = n + 8
    if slot then fields[n + 1], fields[n + 2] = 'ck', slot; n = n + 2 end
    if laned then fields[n + 1], fields[n + 2] = 'fk', laned end
    rcall('HSET', jk, unpack(fields))
    local n = #out
    out[n + 1], out[n + 2], out[n + 3] = id, f.m, tok
    out[n + 4], out[n + 5], out[n + 6], out[n + 7] = 1, tonumber(f.e) or 0, 0, q
    out[n + 8] = tonumber(f.r) or 0
  end
  one_line = claimed_job(q, id, lease_until, leases, ids)
end

-- A job id taken from its fair key's lane (`fk`: the marker's '<weight>|<task>|<key>'):
-- the usual one, a waiting job string of this queue and level, is read and deleted in
-- one GETDEL (no TYPE first) and claimed here without a table of its fields; any other
-- (a job hash: retried or handed back; a claim with limits; a stale or foreign string,
-- put back as it was) is activate's.
local function claim_laned(id, q, prio, fk)
  -- (A lane holds job ids, which hold no '|', and '|', a removed job's entry.)
  if id == '|' then return end
  if has_limits then return activate(id, q, prio, fk) end
  if stale_any[q] ~= false and take_stale(q, prio, id) then return end
  local jk = k_job(q, id)
  local raw = rpcall('GETDEL', jk)
  if type(raw) ~= 'string' then
    if not raw then return end  -- an id with no job behind it: dropped
    return activate(id, q, prio, fk)  -- not a string (WRONGTYPE): a hash, or bytes
  end
  local s, rq, o, e, p, r, at = string.match(raw, '^([ws])([^|]*)|(%d+)|(%d+)|(%-?%d*)|(%d*)|()')
  if s ~= 'w' or (rq ~= '' and rq ~= q) or (p ~= '' and p ~= prio) or (p == '' and prio ~= '0') then
    rcall('SET', jk, raw)
    return activate(id, q, prio, fk)
  end
  local m = string.sub(raw, at)
  claimed = claimed + 1
  local tok = tok_prefix .. count_text(claimed)
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
  local n = #out
  out[n + 1], out[n + 2], out[n + 3] = id, m, tok
  out[n + 4], out[n + 5], out[n + 6], out[n + 7] = 1, tonumber(e) or 0, 0, q
  out[n + 8] = r ~= '' and tonumber(r) or 0
  one_line = claimed_job(q, id, lease_until, leases, ids)
end

-- A fair key's turn (its marker `v` popped from level `prio` of `q`): up to its weight
-- of jobs from its lane, while this claim has room. Returns the marker to put back at
-- the head when the claim ran out of room mid-turn (the caller pushes it last, so it
-- is first out); else the marker goes back to the tail (jobs left: into `tails`, which
-- the claim loop pushes in one LPUSH after each pop, in order) or away (none).
take_turn = function(q, prio, v)
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
  local lk = k_lane(q, group, prio)
  local left = true
  while taken < weight and claimed < limit and pops < max_pops do
    -- As many as the turn and the claim have room for, in one RPOP (a stale id among
    -- them takes its place in the turn, as on the embedded broker); one is popped
    -- without a count (its answer is the id, not a table of it).
    local want = math.min(weight - taken, limit - claimed, max_pops - pops)
    if want == 1 then
      local id = rpcall('RPOP', lk)
      if type(id) ~= 'string' then left = false; break end
      pops, taken = pops + 1, taken + 1
      claim_laned(id, q, prio, fk)
    else
      local ids = rpcall('RPOP', lk, num_text(want))
      if type(ids) ~= 'table' or ids.err then ids = {} end
      for _, id in ipairs(ids) do
        pops, taken = pops + 1, taken + 1
        claim_laned(id, q, prio, fk)
      end
      if #ids < want then left = false; break end
    end
  end
  if left and rcall('EXISTS', lk) == 0 then left = false end
  if not left then
    rcall('SREM', k_lanes(q), prio .. '|' .. group)
    return nil
  end
  if taken < weight then
    rcall('ZADD', k_levels(q), level_score(prio), prio)
    return '~' .. taken .. '|' .. fk
  end
  -- Back at the tail (a marker that began its turn at 0 is the same text again).
  if ts ~= '0' then v = '~0|' .. fk end
  tails[#tails + 1] = v
  return nil
end

-- A fair job (`body`; its order `o`, or its hash `jk` to read it from) popped from its
-- level list: it joins its key's lane. A key with
-- no job waiting takes its turn now, where the job stood in the line. Returns true when
-- the job was fair (moved, or claimed by its turn), false for any other job.
divert = function(q, prio, id, body, o, jk)
  local group, weight = fair_of(body)
  if not group then return false end
  if jk then o = rcall('HGET', jk, 'o') end  -- (a job hash's order, read only for a fair one)
  local lk = k_lane(q, group, prio)
  local head = rcall('LINDEX', lk, -1)
  if head then
    -- The key has jobs waiting: a job older than its lane's head (a hand-back, a stall
    -- recovery: its old place) goes first, any other at the tail.
    local r = read_keyed(q, head, 'o')
    if r and tonumber(o) and tonumber(r[1]) and tonumber(o) < tonumber(r[1]) then
      rcall('RPUSH', lk, id)
    else
      rcall('LPUSH', lk, id)
    end
    return true
  end
  rcall('LPUSH', lk, id)
  rcall('SADD', k_lanes(q), prio .. '|' .. group)
  local back = take_turn(q, prio, '~0|' .. weight .. '|' .. group)
  if back then rcall('RPUSH', k_wait(q, prio), back) end
  return true
end

while claimed < limit and pops < max_pops do
  local bq, blk, bprio
  if nq == 1 then
    -- One queue: its best level's list is popped without a TYPE first; a level whose
    -- list is missing or of another type (RPOP: nil or an error) goes, as in head_of.
    bq = ARGV[7]
    local t = rcall('ZRANGE', k_levels(bq), '0', '0')
    if #t == 0 then break end
    bprio, blk = t[1], k_wait(bq, t[1])
  else
    local bestp, besto
    for qi = 7, 6 + nq do
      local q = ARGV[qi]
      local prio, lk, o = live_head(q)
      if prio then
        local p = tonumber(prio)
        -- Higher priority first; equal priority in two queues: the older head.
        if not bq or p > bestp or (p == bestp and o < besto) then
          bq, blk, bprio, bestp, besto = q, lk, prio, p, o
        end
      end
    end
    if not bq then break end
  end
  -- One queue: pop as many as wanted at once; several: one at a time, re-comparing.
  local want = 1
  if nq == 1 then want = math.min(limit - claimed, max_pops - pops) end
  local popped = rpcall('RPOP', blk, num_text(want))
  if type(popped) ~= 'table' or popped.err then popped = {} end
  -- Fewer than asked: the list is empty now (Redis deleted it), so its level goes too
  -- (the next round looks at the next level instead of finding this one empty).
  if #popped < want then rcall('ZREM', k_levels(bq), bprio) end
  for j, id in ipairs(popped) do
    pops = pops + 1
    local back = activate(id, bq, bprio)
    if back or (claimed >= limit and j < #popped) then
      -- A fair turn took more than one job (or stopped mid-turn): what this claim has
      -- no room for goes back to the head, in order, the unfinished turn first.
      for k = #popped, j + 1, -1 do rcall('RPUSH', blk, popped[k]) end
      if back then rcall('RPUSH', blk, back) end
      rcall('ZADD', k_levels(bq), level_score(bprio), bprio)
      break
    end
  end
  if #tails > 0 then
    -- The ended turns' markers, at the tail in turn order; a level list this claim
    -- emptied (and unlisted) is listed again.
    if rcall('LPUSH', blk, unpack(tails)) == #tails then
      rcall('ZADD', k_levels(bq), level_score(bprio), bprio)
    end
    tails = {}
  end
end

if leases then
  for q, m in pairs(leases) do
    for s = 1, #m, 1000 do
      rcall('ZADD', k_active(q), unpack(m, s, math.min(s + 999, #m)))
    end
  end
end
if claimed > 0 then
  rcall('SET', KEYS[3], token .. '\n' .. (ids and table.concat(ids, "\n") or one_line), 'PX',
    REQ_TTL_MS)
end
if claimed < limit then
  if not settles then mark_waiters(ARGV, 7, 6 + nq) end
  if pops >= max_pops then
    out[1] = 0  -- stopped early: more may be waiting
  else
    local next_due = nil
    for qi = 7, 6 + nq do
      local q = ARGV[qi]
      local t = rcall('ZRANGE', k_sched(q), '0', '0', 'WITHSCORES')
      if #t > 0 and (not next_due or tonumber(t[2]) < next_due) then next_due = tonumber(t[2]) end
    end
    for qi = 7, 6 + nq do
      local q = ARGV[qi]
      if gated and gated[q] then
        local t = rcall('ZRANGE', k_gates(q), '0', '0', 'WITHSCORES')
        local opens = #t > 0 and tonumber(t[2])
        if opens and opens < math.huge and (not next_due or opens < next_due) then
          next_due = opens
        end
      end
    end
    if next_due then out[1] = math.max(0, next_due - now) end
  end
end
if settled then return settle_answer(out, settled) end
flush_counts()
return out
