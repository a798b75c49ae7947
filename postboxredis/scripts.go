package postboxredis

import "github.com/redis/go-redis/v9"

// The consumer side's scripts. Each checks and changes a group's pending
// entries in one step, so that no other subscriber can claim an entry
// between the check and the change. KEYS[1] is always the stream, ARGV[1]
// the group and ARGV[2] the consumer.

// claimScript claims entries idle for at least ARGV[3] ms, from the
// cursor ARGV[4], at most ARGV[5] of them (XAUTOCLAIM), and adds each
// one's delivery count, which XAUTOCLAIM does not return. It returns
// {next cursor, {{entry id, {field, value, ...}, deliveries}, ...},
// {ids of pending entries no longer in the stream}}; Redis 7 removes
// those from the pending list as it reports them.
var claimScript = redis.NewScript(`
local r = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], 'COUNT', ARGV[5])
local out = {}
for _, e in ipairs(r[2]) do
  if e and e[2] then
    local p = redis.call('XPENDING', KEYS[1], ARGV[1], e[1], e[1], 1)
    local n = 0
    if p[1] then n = p[1][4] end
    out[#out + 1] = {e[1], e[2], n}
  end
end
return {r[1], out, r[3] or {}}
`)

// touchScript sets the idle time of entries the consumer still owns:
// ARGV[3...] are pairs of entry id and idle time in ms. An idle time of
// 0 keeps an entry held by a live subscriber from being claimed; a
// larger one hands it back, claimable by the group's next claim pass
// once it reaches MinIdle. The delivery count is left as it is. It
// returns the ids the consumer no longer owns: another subscriber claimed
// them, or they were acknowledged or deleted.
var touchScript = redis.NewScript(`
local lost = {}
for i = 3, #ARGV, 2 do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p[1] and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'IDLE', ARGV[i + 1], 'JUSTID')
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
`)

// redeliverScript counts a new delivery of entry ARGV[3] to the
// consumer, when it still owns it, and returns the new delivery count;
// -1 when it does not own it any more.
var redeliverScript = redis.NewScript(`
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if not p[1] or p[1][2] ~= ARGV[2] then return -1 end
local n = p[1][4] + 1
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'RETRYCOUNT', n, 'JUSTID')
return n
`)

// deleteConsumerScript deletes the consumer if nothing is pending for
// it: deleting a consumer drops its pending entries from the group, so a
// consumer with any is never deleted.
var deleteConsumerScript = redis.NewScript(`
local p = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if p[1] then return 0 end
return redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
`)

// pruneConsumersScript deletes the group's consumers, other than
// ARGV[2], that have nothing pending and were idle for more than ARGV[3]
// ms: subscribers that died, once their entries were claimed. A live
// subscriber deleted by mistake is made again by its next XREADGROUP.
var pruneConsumersScript = redis.NewScript(`
local n = 0
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local f = {}
  for i = 1, #c, 2 do f[c[i]] = c[i + 1] end
  if f['pending'] == 0 and f['idle'] > tonumber(ARGV[3]) and f['name'] ~= ARGV[2] then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], f['name'])
    n = n + 1
  end
end
return n
`)

// fetchScript takes entry ARGV[3] back into memory when the consumer
// still owns it: it returns {delivery count, {field, value, ...}},
// leaving the count as it is (the entry was read before, but never
// processed), or nil when the consumer does not own it any more or the
// entry was deleted.
var fetchScript = redis.NewScript(`
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if not p[1] or p[1][2] ~= ARGV[2] then return false end
local e = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'RETRYCOUNT', p[1][4])
if not e[1] or not e[1][2] then return false end
return {p[1][4], e[1][2]}
`)
