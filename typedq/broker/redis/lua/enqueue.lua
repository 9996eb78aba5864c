#!lua
-- Store a batch of jobs: a waiting job as its entry in its level list and its id in
-- the queue's index, a scheduled one as one job string (see keys.py); an existing id is
-- not replaced (created = 0), and a repeated id in the batch is stored once (its
-- first occurrence). max_queue_length counts only the jobs this call creates.
-- Refused at maxmemory (no allow-oom flag): enqueues are what fills Redis.
-- A re-sent call (same request record: lost reply, client retry) returns the first
-- copy's answer, so the jobs it created still answer created = 1.
-- KEYS[1] = the first job's queue's order counter, KEYS[2] = this call's request record
-- (on that queue's slot). On Redis Cluster every job of a call is of one queue.
-- Each queue's order counter numbers its own jobs.
-- ARGV: P, max_queue_length, n, then n x (id, queue, priority, eta_us, delay_us, body),
--   or, when every job of the call has the same queue, priority, eta and delay (a bulk
--   enqueue: the usual case), P, max_queue_length, n, '', queue, priority, eta_us,
--   delay_us, then n x (id, body): two arguments per job instead of six ('' in place of
--   the first id tells the forms apart: an id is never empty).
--   Either form may end with n more: each job's waiting index bucket (keys.py's
--   index_bucket of its id), so that Redis does not hash the id (a SHA1 costs the
--   script ~6,500 instructions per job, a third of the rest of its work per job).
local limit, n = tonumber(ARGV[2]), tonumber(ARGV[3])
local shared = ARGV[4] == ''
-- Job i's arguments start at ARGV[first + stride * i]: its id, then (one per job) its
-- queue, priority, eta, delay, then its body at + body_at.
local first, stride, body_at = 4, 6, 5
if shared then first, stride, body_at = 9, 2, 1 end
if not limit or not is_int(n) or n < 0 then return bad_args('enqueue') end
-- Job i's bucket is ARGV[buckets + i] (i from 1; nil: none sent, the script hashes).
local buckets = first - 1 + stride * n
if #ARGV == buckets then
  buckets = nil
elseif #ARGV ~= buckets + n then
  return bad_args('enqueue')
end
-- (A '0' is taken as it is: most jobs have priority, eta and delay 0, and every tonumber
-- of a string is a strtod. A queue name holds no '|': the job string's fields are
-- separated by it.)
-- The shared form's fields are looked at once (with its first job), then only its ids.
local checked = n - 1
if shared and n > 1 then checked = 0 end
for i = 0, checked do
  local b = first + stride * i
  local q, prio, eta, delay = ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4]
  if shared then q, prio, eta, delay = ARGV[5], ARGV[6], ARGV[7], ARGV[8] end
  if ARGV[b] == '' or q == '' or string.find(q, '|', 1, true)
      or (prio ~= '0' and not is_int(prio)) or (eta ~= '0' and not tonumber(eta))
      or (delay ~= '0' and not tonumber(delay)) then
    return bad_args('enqueue')
  end
end
if shared then
  for b = first + 2, #ARGV, 2 do
    if ARGV[b] == '' then return bad_args('enqueue') end
  end
end
-- The one queue, priority, eta and delay of every job of the call (nil: each job has
-- its own): the shared form's, or the one job's (its arguments are at the same places).
-- With one queue, what is kept per queue below is a number, not a table per call.
local sq, sprio, seta, sdelay
if shared or n == 1 then sq, sprio, seta, sdelay = ARGV[5], ARGV[6], ARGV[7], ARGV[8] end

local prev = rpcall('GET', KEYS[2])
if type(prev) == 'string' and #prev == n then
  local again = {}
  for i = 1, n do again[i] = string.byte(prev, i) - 48 end
  return again
end

local now = now_us()
-- The usual call (a bulk enqueue, or one job): one queue, level and time for every job,
-- none scheduled, and no max_queue_length the call could pass even were every job new.
-- Then a job is new unless its key exists (one EXISTS of all the job keys: none, as a
-- rule) or its index field does: HSETNX writes the field where it is missing and says
-- whether it was (a repeated id of the call finds its first occurrence's), so the
-- index costs one command per job instead of HEXISTS then HSET. The orders are taken
-- before (INCRBY of the jobs with no key) and the ones not used given back (the
-- repeats, rare), so the new jobs' orders stay dense and in call order, as below.
if sq and n > 0 and run_at_of(seta, sdelay, now) <= now
    and (limit <= 0 or not queue_full(sq, n, limit)) then
  local keys, ids, jp = {}, {}, k_job(sq, '')
  for i = 0, n - 1 do
    local id = ARGV[first + stride * i]
    ids[i + 1] = id
    keys[i + 1] = jp .. id  -- (k_job)
  end
  -- keyless[i]: job i has no key of its own (every job, when the one EXISTS says so).
  local keyless, candidates, existing = nil, n, 0
  for s = 1, n, 500 do
    existing = existing + rcall('EXISTS', unpack(keys, s, math.min(s + 499, n)))
  end
  if existing > 0 then
    keyless, candidates = {}, 0
    for i = 1, n do
      keyless[i] = rcall('EXISTS', keys[i]) == 0
      if keyless[i] then candidates = candidates + 1 end
    end
  end
  -- out: the answer; rec: the same as text for the request record (a number
  -- table.concat formats with '%.14g', a sprintf each).
  local out, rec, entries, fresh, order = {}, {}, {}, 0, 0
  if candidates > 0 then
    order = rcall('INCRBY', k_seq(sq), num_text(candidates)) - candidates
  end
  local now_text, tail = last_now_text, sprio ~= '0' and '|' .. sprio or ''
  local ip, format, call = k_idx_prefix(sq), string.format, redis.call
  -- Idle workers registered for a direct hand-off (common/bookkeeping.lua's hand_off):
  -- the new jobs are gathered for it (hid, ho, hm: id, order, body) instead of as
  -- waiting entries. A registration exists only while nothing waits in the queue.
  -- (hik: their index buckets' keys.) Their index fields are written only for the jobs
  -- the hand-off leaves waiting: a new job is one whose field is missing (HEXISTS) and
  -- not taken by an earlier job of the call (seen), so a handed job costs one command
  -- of the index, not a HSETNX and the hand-off's HDEL of it.
  local hid, ho, hm, hik, seen = nil, nil, nil, nil, nil
  if rcall('EXISTS', k_fixed(sq, 'H')) == 1 then hid, ho, hm, hik, seen = {}, {}, {}, {}, {} end
  for i = 1, n do
    out[i], rec[i] = 0, '0'
    if not keyless or keyless[i] then
      local id = ids[i]
      local o = format('%d', order + fresh + 1)
      local ik = buckets and ip .. ARGV[buckets + i] or idx_bucket(id, ip)  -- (k_idx)
      if hid then
        if not seen[id] and call('HEXISTS', ik, id) == 0 then
          seen[id] = true
          fresh = fresh + 1
          hid[fresh], ho[fresh], hm[fresh] = id, o, ARGV[first + stride * (i - 1) + body_at]
          hik[fresh] = ik
          out[i], rec[i] = 1, '1'
        end
      elseif call('HSETNX', ik, id, o .. tail) == 1 then
        fresh = fresh + 1
        entries[fresh] = id .. '|' .. o .. '|' .. now_text .. '||' .. ARGV[first + stride * (i - 1) + body_at]
        out[i], rec[i] = 1, '1'
      end
    end
  end
  if fresh < candidates then
    rcall('INCRBY', k_seq(sq), num_text(fresh - candidates))
  end
  local stored = fresh
  if hid and fresh > 0 then
    local handed = hand_off(sq, sprio, hid, ho, hm, 1, fresh, now, now_text, false)
    for j = handed + 1, fresh do
      call('HSET', hik[j], hid[j], ho[j] .. tail)  -- (waits: its index field)
      entries[j - handed] = hid[j] .. '|' .. ho[j] .. '|' .. now_text .. '||' .. hm[j]
    end
    stored = fresh - handed
  end
  if stored > 0 then
    push_entries(sq, sprio, k_wait(sq, sprio), entries)
    count(sq, 'w', stored)
    work_queues[sq] = true
  end
  if fresh > 0 then
    rcall('SET', KEYS[2], table.concat(rec), 'PX', REQ_TTL_MS)
  end
  flush_counts()
  publish()
  return out
end
-- adding: queue -> its new jobs (several queues; with one, that is `fresh`).
local new, adding, fresh = {}, not sq and {}, 0
local seen = n > 1 and {}  -- (one job: no repeats to look for)
for i = 0, n - 1 do
  local b = first + stride * i
  local id, q = ARGV[b], sq or ARGV[b + 1]
  local key = seen and (sq and id or q .. '|' .. id)
  local ik = not (seen and seen[key]) and rcall('EXISTS', k_job(q, id)) == 0
    and (buckets and k_idx_prefix(q) .. ARGV[buckets + i + 1] or k_idx(q, id))
  if ik and rcall('HEXISTS', ik, id) == 0 then
    new[i] = ik  -- the id's index bucket (one SHA1 per job)
    fresh = fresh + 1
    if adding then adding[q] = (adding[q] or 0) + 1 end
  end
  if seen then seen[key] = true end
end
if limit > 0 then
  if sq then
    local full = fresh > 0 and queue_full(sq, fresh, limit)
    if full then return full end
  else
    for q, extra in pairs(adding) do
      local full = queue_full(q, extra, limit)
      if full then return full end
    end
  end
end

-- Validated: from here on, only writes.
-- The last order taken: per queue (orders), or of the one queue (order).
local orders, order = nil, 0
if sq then
  if fresh > 0 then order = rcall('INCRBY', k_seq(sq), num_text(fresh)) - fresh end
else
  orders = {}
  for q, extra in pairs(adding) do
    orders[q] = rcall('INCRBY', k_seq(q), num_text(extra)) - extra
  end
end
local out = {}
-- The waiting entries to push: of the one queue's one level (one_list), or per level
-- list (lists: list key -> entries; list_order: {list key, queue, priority} per list).
local one_list, lists, list_order = nil, nil, nil
if sq then one_list = {} else lists, list_order = {}, {} end
local now_text = last_now_text
for i = 0, n - 1 do
  local b = first + stride * i
  if new[i] then
    local id, q, prio, eta, delay = ARGV[b], sq, sprio, seta, sdelay
    if not shared then q, prio, eta, delay = ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4] end
    local run_at = run_at_of(eta, delay, now)
    if orders then
      order = orders[q] + 1
      orders[q] = order
    else
      order = order + 1
    end
    if run_at > now then
      local f = {s = 's', q = q, o = order, e = now, p = prio ~= '0' and prio, r = run_at,
        m = ARGV[b + body_at]}
      rcall('SET', k_job(q, id), pack_rec(f))
      rcall('ZADD', k_sched(q), run_at, id)
      count(q, 's', 1)
    else
      local l = one_list
      if not l then
        local lk = k_wait(q, prio)
        l = lists[lk]
        if not l then
          l = {}
          lists[lk] = l
          list_order[#list_order + 1] = {lk, q, prio}
        end
      end
      local o = int_text(order)
      l[#l + 1] = pack_entry(id, o, now_text, ARGV[b + body_at])
      rcall('HSET', new[i], id, idx_val(o, prio))
      count(q, 'w', 1)
    end
    work_queues[q] = true
    out[i + 1] = 1
  else
    out[i + 1] = 0
  end
end
if one_list then
  if #one_list > 0 then push_entries(sq, sprio, k_wait(sq, sprio), one_list) end
else
  for _, entry in ipairs(list_order) do
    push_entries(entry[2], entry[3], entry[1], lists[entry[1]])
  end
end
if fresh > 0 then rcall('SET', KEYS[2], table.concat(out), 'PX', REQ_TTL_MS) end
flush_counts()
publish()
return out
