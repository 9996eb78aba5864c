#!lua flags=allow-oom
-- Delete jobs and their index entries, only while in one of `states` ('' = any).
-- A waiting job's list entry stays behind, counted as stale (see common.lua); claim
-- skips it.
-- KEYS[1] = active, KEYS[2] = done:c, KEYS[3] = done:f, KEYS[4] = done:x
-- ARGV: P, states (letters), ids...
-- Returns per id: 1 deleted, 0 kept or missing.
if #ARGV < 2 then return bad_args('remove') end
local states = ARGV[2]
local done_key = {c = KEYS[2], f = KEYS[3], x = KEYS[4]}
local out = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local r = read_job(id, 's', 'q', 'p', 'ck')
  local s = r and r[1]
  if s and (states == '' or string.find(states, s, 1, true)) then
    local q = r[2] or ''
    if s == 'w' then mark_stale(q, sane_prio(r[3]), id)
    elseif s == 's' then redis.call('ZREM', k_sched(q), id)
    elseif s == 'a' then
      redis.call('ZREM', KEYS[1], id)
      free_slot(id, q, r[4])
    elseif done_key[s] then redis.call('ZREM', done_key[s], id) end
    local link = flow_link(id)
    redis.call('DEL', k_job(id))
    count(q, s, -1)
    done_ids[#done_ids + 1] = id
    flow_removed(link, s)
    out[i - 2] = 1
  else
    out[i - 2] = 0
  end
end
flush_counts()
publish()
return out
