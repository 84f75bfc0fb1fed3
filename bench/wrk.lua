-- bench/wrk.lua: the load that bench/common.ts asks wrk for. Every request POSTs the article's payment
-- event with an X-Delivery-Id unique across threads (a per-thread prefix and counter); a fraction of
-- them repeats a recent ID. done() prints one JSON line, so the counts and percentiles are exact.
--   wrk -t2 -c32 -d4s --latency -s bench/wrk.lua http://127.0.0.1:PORT -- PREFIX DUPLICATES BODY

local threads = {}
local next_thread = 1

function setup(thread)
  thread:set("thread_id", next_thread)
  next_thread = next_thread + 1
  table.insert(threads, thread)
end

function init(args)
  prefix = (args[1] or "wrk") .. "-" .. thread_id .. "-"
  duplicates = tonumber(args[2] or "0")
  body = args[3]
  n = 0
  math.randomseed(thread_id * 7919 + os.time())
end

-- No response() callback: defining one makes wrk copy every answer's headers into Lua, which costs the
-- generator CPU that the server under test would otherwise get. Non-2xx answers come from summary.errors.status.
function request()
  local id
  if duplicates > 0 and n > 100 and math.random() < duplicates then
    id = n - 1 - math.random(0, 99)
  else
    id = n
    n = n + 1
  end
  return wrk.format("POST", "/", { ["Content-Type"] = "application/json", ["X-Delivery-Id"] = prefix .. id }, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\n{"requests":%d,"duration_us":%d,"non2xx":%d,"errors":%d,"p50_us":%d,"p99_us":%d,"p999_us":%d,"max_us":%d,"cpu_s":%.3f}\n',
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9), latency.max, os.clock()))
end
