#!lua
-- Store progress for a running job, fenced by token. Returns 1, or 0 if not ours.
-- KEYS[1] = the job's key
-- ARGV: P, queue, id, token, progress
if #ARGV ~= 5 then return bad_args('progress') end
local q, id = ARGV[2], ARGV[3]
local r = read_hash(q, id, 's', 't')
if r and r[1] == 'a' and r[2] == ARGV[4] then
  redis.call('HSET', k_job(q, id), 'pg', ARGV[5])
  return 1
end
return 0
