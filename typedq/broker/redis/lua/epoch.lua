#!lua flags=allow-oom
-- The app's epoch: written once, when missing, as '<Redis unix time>-<candidate>'.
-- Only a loss of data removes or replaces it (a restart without persistence,
-- FLUSHALL/FLUSHDB, a failover to an empty replica), so a client that remembers
-- the value it saw notices the loss. Idempotent: a re-sent call returns the value
-- the first copy wrote.
-- KEYS[1] = epoch
-- ARGV: P, candidate (random, chosen by the client per call)
-- Returns the epoch in Redis now.
if #ARGV ~= 2 or ARGV[2] == '' then return bad_args('epoch') end
local current = redis.pcall('GET', KEYS[1])
if type(current) == 'string' then return current end
-- Missing, or bytes of another type that typedq did not write: a new epoch.
local epoch = redis.call('TIME')[1] .. '-' .. ARGV[2]
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[1], epoch)
return epoch
