#!lua flags=no-writes
-- The shape of a flow and where it stands (typedq inspect): {steps, members, members
-- not settled (-1 once the flow has ended)}, or 0 when the id is no flow's job.
-- ARGV: P, flow id
if #ARGV ~= 2 or ARGV[2] == '' then return bad_args('flow_info') end
local f = ARGV[2]
local meta = redis.call('HMGET', k_flow(f), 'S', 'n', 'c')
if meta[1] then return {tonumber(meta[1]), tonumber(meta[2]), tonumber(meta[3])} end
local shape = read_hash(f, 'fS', 'fn')
if not shape or not shape[1] or not shape[2] then return 0 end
return {tonumber(shape[1]), tonumber(shape[2]), -1}
