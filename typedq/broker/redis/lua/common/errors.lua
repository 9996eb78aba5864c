-- common/errors.lua: A job's error history (the last ERR_HISTORY failure records).
-- (A part of the shared prelude, in the order of scripts.py's PARTS: README.md.)
-- Every attempt's FailureRecord, oldest first, at most ERR_HISTORY: the job hash's 'eh',
-- a msgpack array of bin strings (the records' bytes). Sets 'err' (the newest) too.
-- Lua's cmsgpack has no bin type: the array is read here (nil: not one written here).
-- ERR_HISTORY (generated from the Python value: constants.py).
local function be_int(s, at, width)
  local n = 0
  for i = at, at + width - 1 do n = n * 256 + string.byte(s, i) end
  return n
end
local function read_bins(s)
  local b = string.byte(s, 1)
  local n, at
  if b and b >= 144 and b <= 159 then n, at = b - 144, 2
  elseif b == 220 and #s >= 3 then n, at = be_int(s, 2, 2), 4
  else return nil end
  local out = {}
  for _ = 1, n do
    local t = string.byte(s, at)
    local w = (t == 196 and 1) or (t == 197 and 2) or (t == 198 and 4)
    if not w or at + w > #s then return nil end
    local len = be_int(s, at + 1, w)
    out[#out + 1] = string.sub(s, at + 1 + w, at + w + len)
    at = at + 1 + w + len
  end
  return out
end
local function add_error(q, id, rec)
  local jk = k_job(q, id)
  -- A job failed before 'eh' existed (or garbage there): its last record starts it.
  local old = rcall('HMGET', jk, 'eh', 'err')
  local list = old[1] and read_bins(old[1])
  if not list then list = old[2] and {old[2]} or {} end
  list[#list + 1] = rec
  local first = math.max(1, #list - ERR_HISTORY + 1)
  local parts = {msgpack_array_header(#list - first + 1)}
  for i = first, #list do parts[#parts + 1] = msgpack_bin(list[i]) end
  rcall('HSET', jk, 'err', rec, 'eh', table.concat(parts))
end

