#!lua flags=allow-oom
-- Claim up to `limit` due jobs across queues: highest priority first, then oldest.
-- Promotes due scheduled jobs first. Each claimed job gets the token
-- '<claim token>.<i>'; the claim token is chosen by the client per claim, and the
-- claim is recorded under that token (not under the worker: one worker has several
-- claims in flight), so a re-sent claim (lost reply, client retry) returns the same
-- jobs instead of claiming more. Runs at maxmemory (allow-oom): draining frees memory.
-- KEYS[1] = the first queue's active zset, KEYS[2] = its order counter, KEYS[3] = this
-- claim's record (on the first queue's slot; lines '<queue>|<id>', or '<id>' for a claim of
-- one queue). On Redis Cluster a
-- claim names one queue; on standalone Redis one claim may take from several.
-- ARGV: P, limit, lease_us, claim token, worker id, nq, queues...,
--       [nl, then nl x (task, rate, per_us, concurrency, spacing_us, early_us),
--        [ns, then ns x (queue, completed_ttl_us, completed_max, n, n x (id, token, result))]]
-- Returns {next_due_us (-1: nothing scheduled), then per job: id, body, token,
--          attempt, enqueued_at_us, stalls, queue, due_us (0: due since its enqueue or by
--          its body's eta/delay; set when it became due again: a retry, hand-back, ...)}
-- (enqueued_at_us and due_us are an integer or its decimal text: a waiting entry's own.)
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
-- (claim_ops: common/gates.lua and common/claiming.lua.)
local settled = settles and claim_ops.settle(ARGV, settles, now)

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
  claim_ops.claimed_before(out, prev, token, ARGV[7])
  -- Short: the worker waits after this answer (a notice that consumed the first copy's
  -- mark may have come before this copy was sent, which is what its wait counts from).
  if not settles and (#out - 1) / 8 < limit then mark_waiters(ARGV, 7, 6 + nq) end
  if settled then return claim_ops.settle_answer(out, settled) end
  return out
end

-- Promote due scheduled jobs (bounded per call; the rest next time). A claim of one
-- queue keeps what the look learnt of its scheduled set's head (sched_head: see
-- promote_due), for its next due time below.
local sched_head = nil
if nq == 1 then
  sched_head = claim_ops.promote_due(ARGV[7])
else
  for qi = 7, 6 + nq do claim_ops.promote_due(ARGV[qi]) end
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

-- The claim's state, which its helpers share (common/claiming.lua says what each holds).
-- A claim of several jobs records them as a table of lines and puts their leases into
-- each queue's active set in one ZADD at the end, not one per job (nothing below reads
-- the set); a claim of one keeps its one line itself (claimed_job,
-- common/bookkeeping.lua, returns it). Every claimed job's token is '<claim token>.<i>'.
local c = {limit = limit, now = now, worker = worker, out = out, claimed = 0, pops = 0,
  max_pops = limit + 1000,  -- stale entries are skipped, but not without bound
  has_limits = has_limits, tok_prefix = token .. '.', lease_until = num_text(now + lease),
  ids = limit > 1 and {} or nil, leases = limit > 1 and {} or nil, one_line = nil,
  bare = nq == 1, other = false}
if any_gated then
  -- The limits' state (common/gates.lua), only when this claim limits tasks or a queue
  -- has gates: most claims have neither.
  c.cfg, c.windows, c.expiring, c.holders = cfg or {}, {}, {}, {}
end

-- Open gates give back as many parked jobs as their bucket admits (bounded by this
-- claim's limit), at their old place among the waiting jobs; a gate whose bucket is
-- still closed gets its true opening time. A claim without limits looks too (one
-- EXISTS per queue): after a deploy that dropped a limit, its parked jobs still come
-- back (a gate of a task this claim does not limit gives back as many as it asks for).
if any_gated and limit > 0 then
  for qi = 7, 6 + nq do
    local q = ARGV[qi]
    if gated[q] then claim_ops.open_gates(c, q, limit) end
  end
end

while c.claimed < limit and c.pops < c.max_pops do
  local bq, blk, bprio
  -- (only: one queue's only level, as the look below found it)
  local only = false
  if nq == 1 then
    -- One queue: its best level's list is popped without a TYPE first; a level whose
    -- list is missing or of another type (RPOP: nil or an error) goes, as in head_of.
    -- The next level too: when there is none, a claim that drains this one is done
    -- without a look that finds the levels empty (a short claim: a worker that keeps up).
    bq = ARGV[7]
    local t = rcall('ZRANGE', k_levels(bq), '0', '1')
    if #t == 0 then break end
    bprio, blk, only = t[1], k_wait(bq, t[1]), #t == 1
  else
    local bestp, besto
    for qi = 7, 6 + nq do
      local q = ARGV[qi]
      local prio, lk, o = claim_ops.live_head(c, q)
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
  if nq == 1 then want = math.min(limit - c.claimed, c.max_pops - c.pops) end
  local popped = rpcall('RPOP', blk, num_text(want))
  if type(popped) ~= 'table' or popped.err then popped = {} end
  -- Fewer than asked: the list is empty now (Redis deleted it), so its level goes too
  -- (the next round looks at the next level instead of finding this one empty).
  if #popped < want then rcall('ZREM', k_levels(bq), bprio) end
  for j, id in ipairs(popped) do
    c.pops = c.pops + 1
    local back = claim_ops.activate(c, id, bq, bprio)
    if back or ((c.claimed >= limit or c.pops >= c.max_pops) and j < #popped) then
      -- A fair turn took more than one job (or stopped mid-turn): what this claim has
      -- no room for goes back to the head, in order, the unfinished turn first.
      for k = #popped, j + 1, -1 do rcall('RPUSH', blk, popped[k]) end
      if back then rcall('RPUSH', blk, back) end
      rcall('ZADD', k_levels(bq), level_score(bprio), bprio)
      break
    end
  end
  -- The fair turns that ended with jobs left go back to the tail (one LPUSH).
  if c.tails then claim_ops.push_tails(c, bq, bprio, blk) end
  -- The only level, drained by waiting entries alone (c.other: anything else, a fair
  -- turn, a flow's job, may have listed a level since the look; so may gates): no
  -- level is left.
  if only and #popped < want and not c.other and not any_gated then break end
end

local claimed = c.claimed
if c.leases then
  for q, m in pairs(c.leases) do
    -- (claimed_job left a claim of several jobs' counts to here: once per queue)
    local n = #m / 2
    count(q, 'w', -n)
    count(q, 'a', n)
    for s = 1, #m, 1000 do
      rcall('ZADD', k_active(q), unpack(m, s, math.min(s + 999, #m)))
    end
  end
end
if claimed > 0 then
  rcall('SET', KEYS[3], token .. '\n' .. (c.ids and table.concat(c.ids, "\n") or c.one_line),
    'PX', REQ_TTL_MS)
end
if claimed < limit then
  if not settles then mark_waiters(ARGV, 7, 6 + nq) end
  if c.pops >= c.max_pops then
    out[1] = 0  -- stopped early: more may be waiting
  else
    -- (What promote_due learnt holds unless the claim touched more than waiting entries:
    -- gates, or a job with a key of its own (c.other), e.g. of a flow, whose end may
    -- schedule or unschedule jobs.)
    if any_gated or c.other then sched_head = nil end
    local due = claim_ops.next_due(ARGV, 7, 6 + nq, gated, now, sched_head)
    if due then out[1] = due end
  end
end
if settled then return claim_ops.settle_answer(out, settled) end
flush_counts()
return out
