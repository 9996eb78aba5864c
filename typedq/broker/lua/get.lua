#!lua flags=no-writes
-- Snapshots of jobs: per id, the fields below, or 0 when there is no such job.
-- ARGV: P, ids...
local out = {}
for i = 2, #ARGV do
  local r = read_job(ARGV[i], 's', 'm', 'a', 'e', 'r', 'st', 'fa', 'res', 'err', 'pg', 'k', 'cr', 'w', 'q', 'eh')
  if r then out[i - 1] = r else out[i - 1] = 0 end
end
return out
