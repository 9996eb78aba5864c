#!lua
-- Stage a chunk of a large fan-out's members (typedq/broker/redis/staging.py) before the
-- flow is stored: their bodies go to the flow's staging hash on the members' queue
-- (flow_ops.staged: member index -> body), which nothing claims, counts or inspects, and
-- which expires ttl ms after the last chunk unless flow_enqueue stores the flow (it then
-- keeps it until every member is released: flow_ops.release). A crash before the flow is
-- stored leaves only this hash, which expires. Staging the same chunk again (a re-sent
-- call) writes the same bodies again. Refused at maxmemory, like enqueue.
-- KEYS[1] = the members' queue's order counter
-- ARGV: P, members' queue q, flow id F, queue of the flow's own job fq, ttl (ms), first
--   index i, bodies (member i, i+1, ...: member i's id is F.m<i>)
-- Returns 1 staged, 0 the flow exists already (nothing staged: flow_enqueue answers it),
-- or 'TYPEDQ_FLOW_ID_TAKEN id' when another job has a member's id.
local q, f, fq, ttl, first = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
if not q or q == '' or not f or f == '' or not fq or fq == '' or not is_int(ttl) or ttl < 1
    or not is_int(first) or first < 0 then
  return bad_args('flow_stage')
end
if job_exists(fq, f) then return 0 end
local fields = {}
for j = 7, #ARGV do
  local i = first + j - 7
  local id = f .. '.m' .. i
  if job_exists(q, id) then return 'TYPEDQ_FLOW_ID_TAKEN ' .. id end
  fields[#fields + 1] = i
  fields[#fields + 1] = ARGV[j]
end
local sk = flow_ops.staged(q, f)
if #fields > 0 then redis.call('HSET', sk, unpack(fields)) end
redis.call('PEXPIRE', sk, ttl)
return 1
