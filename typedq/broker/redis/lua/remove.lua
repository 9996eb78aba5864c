#!lua flags=allow-oom
-- Delete jobs and their index entries, only while in one of `states` ('' = any).
-- A waiting job's bare list entry stays behind, counted as stale (see common/finish.lua);
-- claim skips it. A waiting entry is left as '|' (take_entry).
-- KEYS[1] = the queue's active zset
-- ARGV: P, queue, states (letters), ids...
-- Returns per id: 1 deleted, 0 kept or missing.
if #ARGV < 3 or ARGV[2] == '' then return bad_args('remove') end
local q, states = ARGV[2], ARGV[3]
local done_key = {c = k_done(q, 'c'), f = k_done(q, 'f'), x = k_done(q, 'x')}
local out = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  local r = read_job(q, id, 's', 'q', 'p', 'ck', 'o')
  local s = r and r[1]
  if s and (states == '' or string.find(states, s, 1, true)) then
    if s == 'w' then
      if redis.call('EXISTS', k_job(q, id)) == 1 then mark_stale(q, sane_prio(r[3]), id)
      else take_entry(q, id, r[5], sane_prio(r[3])) end
    elseif s == 's' then redis.call('ZREM', k_sched(q), id)
    elseif s == 'a' then
      -- Its handler may still run: the slot is held until its lease ends (ghost_slot).
      local lease_until = redis.call('ZSCORE', k_active(q), id)
      redis.call('ZREM', k_active(q), id)
      ghost_slot(id, q, r[4], lease_until)
    elseif done_key[s] then redis.call('ZREM', done_key[s], id) end
    local link = flow_link(q, id)
    redis.call('DEL', k_job(q, id))
    count(q, s, -1)
    note_done(q, id)
    flow_removed(link, s)
    out[i - 3] = 1
  else
    out[i - 3] = 0
  end
end
flush_counts()
publish()
return flow_reply(out)
