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

/// `KEYS`: stream, meta. `ARGV`: first seq, max entries, max bytes, ttl
/// ms, then the events (one or more, numbered on from the first seq).
/// All of them are appended, or none. `{code, last}`: 1 appended, 0
/// unknown, 2 full, 3 out of order, 4 finished.
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
local first = tonumber(ARGV[1])
if first ~= last + 1 then
  return {3, last}
end
local count = #ARGV - 4
local bytes = tonumber(m[2])
for i = 5, #ARGV do
  bytes = bytes + string.len(ARGV[i])
end
if last + count > tonumber(ARGV[2]) or bytes > tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[2], 'state', 'full')
  redis.call('XADD', KEYS[1], '1-0', 'full', '1')
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  return {2, last}
end
for i = 0, count - 1 do
  redis.call('XADD', KEYS[1], string.format('0-%d', first + i), 'ev', ARGV[5 + i])
end
last = last + count
redis.call('HSET', KEYS[2], 'last', string.format('%d', last), 'bytes', string.format('%d', bytes))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return {1, last}
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
