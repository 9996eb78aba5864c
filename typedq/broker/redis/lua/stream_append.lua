#!lua
-- Append a run's items (then maybe its end entry) to a job's stream, fenced by token
-- (typedq/broker/streams.py). Items: while the token holds the active job; the end entry
-- ('e' the final state letter): once the job is final by this token's own transition.
-- A fresh append (the run's first) empties the stream first: XTRIM keeps the stream's
-- last id, so entry ids keep growing across runs. Returns 1, or 0 when refused.
-- KEYS[1] = the job's key
-- ARGV: P, queue, id, token, attempt, seq, fresh ('1'/''), end ('1'/''), ttl (ms), cap,
--       items...
if #ARGV < 10 then return bad_args('stream_append') end
local q, id, tok = ARGV[2], ARGV[3], ARGV[4]
local r = read_hash(q, id, 's', 't', 'd')
if not r then return 0 end
local fin = ARGV[8] == '1'
if fin then
  if r[3] ~= tok or (r[1] ~= 'c' and r[1] ~= 'f' and r[1] ~= 'x') then return 0 end
elseif r[1] ~= 'a' or r[2] ~= tok then
  return 0
end
local sk = k_jstream(q, id)
if ARGV[7] == '1' then redis.call('XTRIM', sk, 'MAXLEN', 0) end
local a, n, cap = ARGV[5], tonumber(ARGV[6]), ARGV[10]
for i = 11, #ARGV do
  redis.call('XADD', sk, 'MAXLEN', '~', cap, '*', 'a', a, 'n', n, 'd', ARGV[i])
  n = n + 1
end
if fin then redis.call('XADD', sk, 'MAXLEN', '~', cap, '*', 'a', a, 'n', n, 'e', r[1]) end
redis.call('PEXPIRE', sk, ARGV[9])
return 1
