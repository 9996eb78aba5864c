#!lua flags=no-writes
-- The shape of a flow and where it stands (typedq inspect): {steps, members, members
-- not settled (-1 once the flow has ended), flow id}, or 0 when the job is no flow's.
-- The id may be the flow's own job's, a step's or a member's.
-- ARGV: P, job id
if #ARGV ~= 2 or ARGV[2] == '' then return bad_args('flow_info') end
local f = ARGV[2]
local link = read_hash(f, 'fl')
if link and link[1] then f = link[1] end
local meta = redis.call('HMGET', k_flow(f), 'S', 'n', 'c')
if meta[1] then return {tonumber(meta[1]), tonumber(meta[2]), tonumber(meta[3]), f} end
local shape = read_hash(f, 'fS', 'fn')
if not shape or not shape[1] or not shape[2] then return 0 end
return {tonumber(shape[1]), tonumber(shape[2]), -1, f}
