"""The Redis store's server-side Lua scripts: each write that must be atomic (a commit, a log
append, a head's compare-and-set, a lease, a sweep) is one script, run whole on the server
while no other command runs. Kept apart from :mod:`.redis`, the Python that calls them.
"""

from __future__ import annotations

LEASE_CHECK = """
-- nil if this write may go on; else why not. Fenced: the lease's token must still be ours.
-- Unfenced: refused while anyone holds a live lease on the session.
local function lease_refusal(key, fenced, token)
  if fenced then
    local now = redis.call('HGET', key, 'token')
    if now ~= token then return 'lease:' .. tostring(now) end
    return nil
  end
  local h = redis.call('HMGET', key, 'owner', 'expires')
  if h[1] then
    local t = redis.call('TIME')
    local left = tonumber(h[2]) - (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
    if left > 0 then return 'held:' .. h[1] .. ':' .. tostring(left) end
  end
  return nil
end
"""
"""Shared by both scripts: the lease rules of one write, checked inside its atomic script."""

LOG_CHECK = """
-- nil if `start` is the tip of the log (a new one: its parent_len, and it must not exist);
-- else the conflict. Checked before any write, so a refused write leaves nothing behind.
local function log_refusal(p, log, start, newlog, new_parent_len)
  local key = p .. 'log:' .. log
  local exists = redis.call('EXISTS', key) == 1
  if exists == (newlog == '1') then return 'conflict:log' end
  local plen = tonumber(exists and redis.call('HGET', key, 'parent_len') or new_parent_len)
  if plen + redis.call('HLEN', p .. 'msgs:' .. log) ~= start then return 'conflict:tip' end
  return nil
end
"""
"""Shared by both scripts: the log-tip rules of one write."""

# ARGV: prefix, then digest hexes. 1 per blob stored and not condemned, else 0: one script, so a
# sweep (mark and blob gone together) cannot land between the two checks.
HAS_BLOBS = """
local p, out = ARGV[1], {}
for i = 2, #ARGV do
  local ok = redis.call('EXISTS', p .. 'blob:' .. ARGV[i]) == 1
    and redis.call('HEXISTS', p .. 'condemned', ARGV[i]) == 0
  out[i - 1] = ok and 1 or 0
end
return out
"""

# ARGV: prefix, id, session, branch, parent, body, digest, move_head, expected,
#       log, start, new_log(0/1), log_parent, log_parent_len, n_msgs, n_blobs,
#       check_epoch(0/1), gc_epoch, lease key ('' = unfenced), lease token,
#       then n_msgs (chain..data) values, then n_blobs (digest, packed) pairs, then the
#       head's auth string ('' = none).
COMMIT = (
    LEASE_CHECK
    + LOG_CHECK
    + """
local p = ARGV[1]
local fenced = ARGV[19] ~= ''
local refused = lease_refusal(fenced and ARGV[19] or (p .. 'lease:' .. ARGV[3]), fenced, ARGV[20])
if refused then return refused end
local id, session, branch, parent = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local body, digest, move, expected = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local log, start, newlog = ARGV[10], tonumber(ARGV[11]), ARGV[12]
local lparent, lparent_len = ARGV[13], ARGV[14]
local nmsgs, nblobs = tonumber(ARGV[15]), tonumber(ARGV[16])
if ARGV[17] == '1' then
  local epoch = redis.call('HGET', p .. 'meta', 'gc_epoch') or '0'
  if epoch ~= ARGV[18] then return 'conflict:gc_epoch' end
end
if move == '1' then
  local cur = redis.call('HGET', p .. 'heads:' .. session, branch)
  if (expected == '' and cur) or (expected ~= '' and cur ~= expected) then
    return 'conflict:head'
  end
end
if redis.call('EXISTS', p .. 'cp:' .. id) == 1 then return 'conflict:id' end
if log ~= '' then
  local refused = log_refusal(p, log, start, newlog, lparent_len)
  if refused then return refused end
  if newlog == '1' then
    redis.call('HSET', p .. 'log:' .. log, 'session', session, 'parent', lparent,
               'parent_len', lparent_len)
    redis.call('SADD', p .. 'logs', log)
  end
  for i = 1, nmsgs do
    redis.call('HSET', p .. 'msgs:' .. log, tostring(start + i - 1), ARGV[20 + i])
  end
end
local base = 20 + nmsgs
for i = 1, nblobs do
  redis.call('HDEL', p .. 'condemned', ARGV[base + 2 * i - 1])
  redis.call('SET', p .. 'blob:' .. ARGV[base + 2 * i - 1], ARGV[base + 2 * i], 'NX')
end
redis.call('HSET', p .. 'cp:' .. id, 'session', session, 'branch', branch, 'parent', parent,
           'body', body, 'digest', digest)
redis.call('ZADD', p .. 'cps:' .. session, 0, id)
redis.call('ZADD', p .. 'cpids', 0, id)
if move == '1' then
  redis.call('HSET', p .. 'heads:' .. session, branch, id)
  local auth = ARGV[base + 2 * nblobs + 1]
  if auth and auth ~= '' then
    redis.call('HSET', p .. 'headauth:' .. session, branch, auth)
  else
    redis.call('HDEL', p .. 'headauth:' .. session, branch)
  end
  redis.call('SADD', p .. 'sessions', session)
end
return 'ok'
"""
)

# ARGV: prefix, log, start, new_log(0/1), session, log_parent, log_parent_len, lease key
#       ('' = no lease check), lease token ('' = unfenced: refused while the lease is live),
#       then entries.
APPEND = (
    LEASE_CHECK
    + LOG_CHECK
    + """
local p, log, start, newlog = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
if ARGV[8] ~= '' then
  local refused = lease_refusal(ARGV[8], ARGV[9] ~= '', ARGV[9])
  if refused then return refused end
end
local refused = log_refusal(p, log, start, newlog, ARGV[7])
if refused then return refused end
if newlog == '1' then
  redis.call('HSET', p .. 'log:' .. log, 'session', ARGV[5], 'parent', ARGV[6],
             'parent_len', ARGV[7])
  redis.call('SADD', p .. 'logs', log)
end
for i = 10, #ARGV do
  redis.call('HSET', p .. 'msgs:' .. log, tostring(start + i - 10), ARGV[i])
end
return 'ok'
"""
)

# ARGV: prefix, before, then digest hexes. Claims marks still condemned at or before `before`
# and deletes their blobs, atomically (a concurrent revival is a whole script or command).
SWEEP = """
local p, before = ARGV[1], tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV do
  local t = redis.call('HGET', p .. 'condemned', ARGV[i])
  if t and tonumber(t) <= before then
    redis.call('HDEL', p .. 'condemned', ARGV[i])
    redis.call('DEL', p .. 'blob:' .. ARGV[i])
    out[#out + 1] = ARGV[i]
  end
end
return out
"""

# ARGV: prefix, session, at, then ids. Skips heads, unknown ids and other sessions' ids;
# refused ({'held:…'}) while another worker holds a live lease on the session.
PRUNE = (
    LEASE_CHECK
    + """
local p, session, at = ARGV[1], ARGV[2], ARGV[3]
local refused = lease_refusal(p .. 'lease:' .. session, false, nil)
if refused then return {refused} end
local heads = {}
for _, c in ipairs(redis.call('HVALS', p .. 'heads:' .. session)) do heads[c] = true end
local out = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  if not heads[id] and redis.call('HGET', p .. 'cp:' .. id, 'session') == session
     and redis.call('HEXISTS', p .. 'labels:' .. session, id) == 0 then
    if redis.call('HSETNX', p .. 'pruned:' .. session, id, at) == 1 then out[#out + 1] = id end
  end
end
return out
"""
)

# ARGV: prefix, then (digest hex, old data, new data) triples; values are codec + size + data.
REPOINT = """
local p, moved = ARGV[1], 0
for i = 2, #ARGV, 3 do
  local key = p .. 'blob:' .. ARGV[i]
  local v = redis.call('GET', key)
  if v and string.sub(v, 10) == ARGV[i + 1] then
    redis.call('SET', key, string.sub(v, 1, 9) .. ARGV[i + 2])
    moved = moved + 1
  end
end
return moved
"""

# Leases: hash lease:<session> {owner, token, expires (ms, server clock)}; never deleted, so
# tokens only grow. ARGV: key, owner, ttl ms. Returns {status, owner, token, ms left}.
LEASE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local owner = redis.call('HGET', ARGV[1], 'owner')
local token = tonumber(redis.call('HGET', ARGV[1], 'token') or '0')
local expires = tonumber(redis.call('HGET', ARGV[1], 'expires') or '0')
if owner and expires > now and owner ~= ARGV[2] then
  return {'held', owner, token, expires - now}
end
if not owner or expires <= now then token = token + 1 end
redis.call('HSET', ARGV[1], 'owner', ARGV[2], 'token', token,
           'expires', now + tonumber(ARGV[3]))
return {'ok', ARGV[2], token, tonumber(ARGV[3])}
"""

# ARGV: key, token, ttl ms (renew) or -1 (release). Returns 1 if the token still holds it.
RENEW = """
if redis.call('HGET', ARGV[1], 'token') ~= ARGV[2] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
-- expires 0: released; a late renewal must not revive it
if ttl >= 0 and tonumber(redis.call('HGET', ARGV[1], 'expires')) == 0 then return 0 end
if ttl < 0 then redis.call('HSET', ARGV[1], 'expires', 0)
else redis.call('HSET', ARGV[1], 'expires', now + ttl) end
return 1
"""

# ARGV: key. Returns {owner, token, ms left} or {}.
LEASE_INFO = """
local h = redis.call('HMGET', ARGV[1], 'owner', 'token', 'expires')
if not h[1] then return {} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {h[1], tonumber(h[2]), tonumber(h[3]) - now}
"""

# ARGV: key, whether a value is expected ('0'/'1'), it, whether one is set ('0'/'1'), it.
SWAP_META = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if (ARGV[2] == '0' and cur) or (ARGV[2] == '1' and cur ~= ARGV[3]) then return 0 end
if ARGV[4] == '0' then redis.call('HDEL', KEYS[1], ARGV[1])
else redis.call('HSET', KEYS[1], ARGV[1], ARGV[5]) end
return 1
"""

SET_HEAD = """
if ARGV[5] ~= '' and redis.call('HGET', ARGV[5], 'token') ~= ARGV[6] then return -1 end
if ARGV[5] == '' then
  local h = redis.call('HMGET', ARGV[7], 'owner', 'expires')
  if h[1] then
    local t = redis.call('TIME')
    local left = tonumber(h[2]) - (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
    if left > 0 then return -2 end
  end
end
if redis.call('HEXISTS', KEYS[3], ARGV[2]) == 1 then return -3 end
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if (ARGV[3] == '' and cur) or (ARGV[3] ~= '' and cur ~= ARGV[3]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if ARGV[8] and ARGV[8] ~= '' then
  redis.call('HSET', KEYS[4], ARGV[1], ARGV[8])
else
  redis.call('HDEL', KEYS[4], ARGV[1])
end
redis.call('SADD', KEYS[2], ARGV[4])
return 1
"""
"""Lease fence, then: a pruned checkpoint never becomes a head (retention may have marked it
after the engine checked), then the compare-and-set."""
