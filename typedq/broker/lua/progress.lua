#!lua
-- Store progress for a running job, fenced by token. Returns 1, or 0 if not ours.
-- ARGV: P, id, token, progress
if #ARGV ~= 4 then return bad_args('progress') end
local r = read_hash(ARGV[2], 's', 't')
if r and r[1] == 'a' and r[2] == ARGV[3] then
  redis.call('HSET', k_job(ARGV[2]), 'pg', ARGV[4])
  return 1
end
return 0
