#!lua flags=allow-oom
-- Apply hand-offs of flows across slots (Redis Cluster; see the outbox in common/flows.lua)
-- on the slot of their target queue: a member's settlement or the end of a flow at its
-- root, a step's release, the end or the start of a flow's jobs on that queue. Each
-- record takes effect only while its target is in the state it expects, so a record
-- applied twice (a re-sent call, the reaper after the writer's own apply) changes
-- nothing. Its own hand-offs to other slots go to this queue's outbox.
-- KEYS[1] = a key of the target queue's slot (its order counter)
-- ARGV: P, queue, records (cmsgpack arrays, as the outbox holds them)...
-- Returns per record 1 applied, 0 nothing to do (applied already, or the flow ended); a
-- step of a flow's end that a purge began ('Z' with the purge's queue and states)
-- answers {1, the jobs it deleted for the purge} when applied.
local q = ARGV[2]
if #ARGV < 3 or not q or q == '' then return bad_args('flow_apply') end
local recs = {}
for i = 3, #ARGV do
  local ok, rec = pcall(cmsgpack.unpack, ARGV[i])
  if not ok or type(rec) ~= 'table' or type(rec[1]) ~= 'string' or type(rec[2]) ~= 'string'
      or type(rec[3]) ~= 'string' then
    return bad_args('flow_apply')
  end
  recs[#recs + 1] = rec
end
local now = now_us()
local out = {}
for i, rec in ipairs(recs) do out[i] = flow_apply(q, rec, now) end
flush_counts()
publish()
return flow_reply(out)
