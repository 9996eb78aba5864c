-- common/values.lua: The Redis clock, numbers as command text, job strings and hash reads.
-- (A part of the shared prelude, in the order of scripts.py's PARTS: README.md.)
-- Every timestamp, lease deadline and delay uses the Redis clock, in integer
-- microseconds (exact in a Lua double).
-- The last time read (nil: none yet), for bookkeeping that needs no fresher one.
local last_now = nil
-- The same as decimal text: what a command is given (a Lua number passed to redis.call
-- is formatted with '%.17g', several times the cost of the command itself).
local last_now_text = nil
local function now_us()
  local t = rcall('TIME')
  local s, us = t[1], t[2]
  last_now = tonumber(s) * 1000000 + tonumber(us)
  -- The microseconds padded to 6 digits: 9 times in 10 they have 6 already (then one
  -- concatenation, no string.sub of a string made to be cut).
  if #us == 6 then
    last_now_text = s .. us
  else
    last_now_text = s .. string.sub('00000' .. us, -6)
  end
  return last_now
end
-- Integer `n` as decimal text, for a command's argument (see last_now_text). The texts
-- of -1000 .. 1000 (counts' deltas, batch sizes: a few per call) are made once and kept
-- (a string.format is ~2k instructions; at most 2001 short strings).
local small_texts = {}  --@keep
local function num_text(n)
  if n == last_now then return last_now_text end
  local t = small_texts[n]
  if t then return t end
  -- Past 2^53 (or not whole): Redis formats it, as it did before.
  if n >= 9007199254740992 or n <= -9007199254740992 or n ~= math.floor(n) then return n end
  t = string.format('%d', n)
  if n >= -1000 and n <= 1000 then small_texts[n] = t end
  return t
end

-- Decimal text of a count `n` >= 1 (a claimed job's place in its claim, in its token):
-- made once per value up to 1000 and kept, in num_text's small_texts (a number
-- concatenated is formatted with '%.14g': ~1.5k instructions; the same text for an
-- integer).
local function count_text(n)
  local t = small_texts[n]
  if not t then
    t = string.format('%d', n)
    if n <= 1000 then small_texts[n] = t end
  end
  return t
end

local function bad_args(script)
  return redis.error_reply('ERR typedq ' .. script .. ': malformed arguments')
end

local function is_int(v)
  local n = tonumber(v)
  return n ~= nil and n == math.floor(n)
end

-- A job no worker has claimed yet is one string (see keys.py):
--   <state>|<order>|<enqueued_at>|<priority>|<run_at>|<body>
-- with state 'w' or 's', priority empty for 0, run_at empty unless scheduled. The
-- queue is the key's (`q`); records of the previous layout name it after the state
-- letter and are still read. Anything else in a job string is bytes typedq did not
-- write (parse_rec: nil).
local function parse_rec(v, q)
  local s, rq, o, e, p, r, at = string.match(v, '^([ws])([^|]*)|(%d+)|(%d+)|(%-?%d*)|(%d*)|()')
  if not s then return nil end
  if rq ~= '' then q = rq end
  if p == '' then p = false end
  if r == '' then r = false end
  return {s = s, q = q, o = o, e = e, p = p, r = r, m = string.sub(v, at)}
end

local function int_text(v)
  if type(v) == 'number' then return string.format('%d', v) end
  return v
end

local function pack_rec(f)
  return f.s .. '|' .. int_text(f.o) .. '|' .. int_text(f.e) .. '|' .. (f.p or '')
    .. '|' .. (f.r and int_text(f.r) or '') .. '|' .. f.m
end

-- The fields of a job string as the job hash would hold them.
local function rec_fields(f)
  local t = {'m', f.m, 'q', f.q, 's', f.s, 'o', f.o, 'e', f.e}
  if f.p and f.p ~= '0' then t[#t + 1] = 'p'; t[#t + 1] = f.p end
  if f.r then t[#t + 1] = 'r'; t[#t + 1] = f.r end
  return t
end

-- Read fields of a job that must be a hash to matter (active or finished: the
-- fenced transitions, recovery, retention). nil when the key is missing or holds
-- another type: a read never aborts a script.
local function read_hash(q, id, ...)
  local r = rpcall('HMGET', k_job(q, id), ...)
  if type(r) ~= 'table' or r.err or not r[1] then return nil end
  return r
end

