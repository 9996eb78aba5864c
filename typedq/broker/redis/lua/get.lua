#!lua flags=no-writes
-- Snapshots of jobs of one queue: per id, the fields below, or 0 when there is no such job.
-- KEYS[1] = the queue's counts hash
-- ARGV: P, queue, ids...
local q = ARGV[2]
local out = {}
for i = 3, #ARGV do
  local r = read_job(q, ARGV[i], 's', 'm', 'a', 'e', 'r', 'st', 'fa', 'res', 'err', 'pg', 'k', 'cr', 'w', 'q', 'eh')
  if r then
    if not r[14] then r[14] = q end
    out[i - 2] = r
  else
    out[i - 2] = 0
  end
end
return out
