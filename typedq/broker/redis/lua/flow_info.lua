#!lua flags=no-writes
-- The shape of a flow and where it stands (typedq inspect): {steps, members, members
-- not settled (-1 once the flow has ended), flow id, members settled completed, failed,
-- cancelled (0 once the flow has ended)}, or 0 when the job is no flow's.
-- The id may be the flow's own job's, a step's or a member's. A job of a flow across
-- slots on another queue than the root's answers {'at', root queue, flow id}: ask
-- there (the record lives on the root's slot).
-- KEYS[1] = the job's key
-- ARGV: P, queue, job id
if #ARGV ~= 3 or ARGV[2] == '' or ARGV[3] == '' then return bad_args('flow_info') end
local q, f = ARGV[2], ARGV[3]
local fq = q
local link = read_hash(q, f, 'fl', 'fq', 'fx')
if link and link[1] then f, fq = link[1], link[2] or q end
if link and link[3] == '1' and fq ~= q then return {'at', fq, f} end
local meta = redis.call('HMGET', k_flow(fq, f), 'S', 'n', 'c', 'kc', 'kf', 'kx', 'E')
-- (A flow whose end is under way, flow_settle.lua's flow_end, has ended: its record is
-- what its end's next steps read.)
if meta[1] and not meta[7] then
  return {tonumber(meta[1]), tonumber(meta[2]), tonumber(meta[3]), f,
    tonumber(meta[4]) or 0, tonumber(meta[5]) or 0, tonumber(meta[6]) or 0}
end
local shape = read_hash(fq, f, 'fS', 'fn')
if not shape or not shape[1] or not shape[2] then return 0 end
return {tonumber(shape[1]), tonumber(shape[2]), -1, f, 0, 0, 0}
