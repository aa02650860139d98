//! The log's Lua scripts: each checks and changes a stream's two keys in
//! one atomic step and one round trip (see the module docs of
//! [`stream_log`](super)).

/// `KEYS`: stream, meta. `ARGV`: ttl ms. 1 opened, 0 exists.
pub(super) const OPEN: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
redis.call('HSET', KEYS[2], 'last', '0', 'bytes', '0', 'state', 'open')
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return 1
";

/// `KEYS`: stream, meta. `ARGV`: seq, event, max entries, max bytes, ttl ms.
/// `{code, last}`: 1 appended, 0 unknown, 2 full, 3 out of order,
/// 4 finished.
pub(super) const APPEND: &str = r"
local m = redis.call('HMGET', KEYS[2], 'last', 'bytes', 'state')
if not m[1] then
  return {0, 0}
end
local last = tonumber(m[1])
if m[3] == 'full' then
  return {2, last}
end
if m[3] ~= 'open' then
  return {4, last}
end
if tonumber(ARGV[1]) ~= last + 1 then
  return {3, last}
end
local bytes = tonumber(m[2]) + string.len(ARGV[2])
if last + 1 > tonumber(ARGV[3]) or bytes > tonumber(ARGV[4]) then
  redis.call('HSET', KEYS[2], 'state', 'full')
  redis.call('XADD', KEYS[1], '1-0', 'full', '1')
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
  return {2, last}
end
redis.call('XADD', KEYS[1], '0-' .. ARGV[1], 'ev', ARGV[2])
redis.call('HSET', KEYS[2], 'last', ARGV[1], 'bytes', tostring(bytes))
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return {1, last + 1}
";

/// `KEYS`: stream, meta. `ARGV`: ttl ms. 1 finished (or already), 0 unknown.
pub(super) const FINISH: &str = r"
local s = redis.call('HGET', KEYS[2], 'state')
if not s then
  return 0
end
if s == 'open' then
  redis.call('HSET', KEYS[2], 'state', 'done')
  redis.call('XADD', KEYS[1], '1-0', 'end', '1')
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return 1
";

/// `KEYS`: stream, meta. `ARGV`: first id, count. Nil when unknown, else
/// the entries from the first id on (the marker included).
pub(super) const RANGE: &str = r"
if redis.call('EXISTS', KEYS[2]) == 0 then
  return false
end
return redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2])
";
