-- What clients see of a host's gateway, measured at the gateway: per model, version and route role, the
-- requests counted by status class and a histogram of their latency, kept in the shared dict
-- "modelyard_metrics" (no per-request I/O) and answered in Prometheus's text exposition format
-- (https://prometheus.io/docs/instrumenting/exposition_formats/) at GET /metrics.
--
-- Roles: "stable" and "canary" (a request that named no version, given one by its model's route), "pinned"
-- (a request that named its version), "shadow" (the copy a route mirrored to its shadow version; no client
-- sees its answer), "unrouted" (a request that named no version, for a model without a route, whose answer named
-- no version either: an error; version "") and "refused" (version "": over its model's body limit before it
-- was routed, or a 404, an unknown version or model, under model "" when the model has no route, so that
-- clients cannot add series at will). A model without a route counts its answers under the version Triton's
-- answer names, as "stable" (modelyard_gateway.lua's answered()).
--
-- Latency is from the request's rewrite phase to its log phase on a monotonic clock (clock_gettime through
-- LuaJIT's FFI: nginx's own $request_time counts whole milliseconds, too coarse for models that answer in
-- less than one), so it includes reading the body, Triton's answer and sending it.
--
-- Keys, tab separated, none of whose fields can hold a tab (model names are URI path segments):
--   "n\t<model>\t<version>\t<role>\t<class>"  requests answered with a status of that class ("2xx" ...)
--   "b\t<model>\t<version>\t<role>\t<i>"      requests whose latency fell in bucket i (not cumulative)
--   "s\t<model>\t<version>\t<role>"           the sum of their latencies, in seconds
-- When the dict is full, nginx evicts the least recently used keys: a counter evicted reads as reset.
--
-- Every version that starts serving has its series at 0 before its first request, so that request counts as a
-- rise from 0 (Prometheus's rate() and increase() need two samples): a routed one's when its route is applied
-- (create_route, from modelyard_routes.lua), one served without a route (a plain deployment) when the agent says
-- so on the control socket (POST /series, control).
local ffi = require("ffi")
local cjson = require("cjson.safe")

local M = {}
local metrics = ngx.shared.modelyard_metrics

-- Upper bounds of the latency buckets, in seconds (+Inf follows): 0.25 ms to 30 s in steps of 1-2.5-5.
M.BUCKETS = { 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30 }
local BUCKETS, INF = M.BUCKETS, #M.BUCKETS + 1
local CLASSES = { "2xx", "4xx", "5xx" }  -- created at 0 with each version that serves (others when first seen)

pcall(ffi.cdef, "typedef struct { long tv_sec; long tv_nsec; } modelyard_timespec;"
    .. " int clock_gettime(int clock_id, modelyard_timespec *tp);")
local CLOCK_MONOTONIC = 1
local timespec = ffi.new("modelyard_timespec")

local function monotonic()
    ffi.C.clock_gettime(CLOCK_MONOTONIC, timespec)
    return tonumber(timespec.tv_sec) + tonumber(timespec.tv_nsec) * 1e-9
end

-- rewrite_by_lua, first of all: the request's clock starts.
function M.start()
    ngx.ctx.modelyard_started = monotonic()
end

-- rewrite_by_lua of a shadow copy's subrequest, once it is given `version`: its clock starts, in its own
-- ngx.ctx (a subrequest shares its request's variables, not its ctx).
function M.start_shadow(version)
    ngx.ctx.modelyard_shadow_version = string.format("%d", version)
    M.start()
end

local function bucket(seconds)
    for i = 1, #BUCKETS do
        if seconds <= BUCKETS[i] then
            return i
        end
    end
    return INF
end

-- What Triton answers with a 500 to a body it could not read as an inference request: a client's error, which
-- counts as a 4xx (the client still gets Triton's 500 and message). Seen on Triton 2.41: malformed JSON ("failed
-- to parse the request JSON buffer: Invalid value. at 12") and JSON of the wrong shape ("Unable to parse 'inputs':
-- attempt to access JSON non-array as array").
local MALFORMED = { '^{"error":"failed to parse the request JSON', "^{\"error\":\"Unable to parse '" }

-- body_filter_by_lua: on a 500, whether its first chunk is Triton's refusal of a malformed body (MALFORMED), so
-- that observe() counts it as a client's error. Any other answer costs one comparison.
function M.classify()
    local ctx = ngx.ctx
    if ngx.status ~= 500 or ctx.modelyard_malformed ~= nil then
        return
    end
    local chunk = ngx.arg[1]
    if type(chunk) ~= "string" or chunk == "" then
        if ngx.arg[2] then
            ctx.modelyard_malformed = false
        end
        return
    end
    ctx.modelyard_malformed = false
    for _, pattern in ipairs(MALFORMED) do
        if chunk:find(pattern) then
            ctx.modelyard_malformed = true
            return
        end
    end
end

-- log_by_lua: count the request's answer (ngx.status) and its latency under (model, version, role). The
-- clock started by start() (or `started`, where ngx.exec dropped ngx.ctx); a request whose clock never
-- started counts from nginx's start time of the request, in whole milliseconds.
function M.observe(model, version, role, started)
    if not metrics or not model then
        return
    end
    started = ngx.ctx.modelyard_started or started
    local seconds
    if started then
        seconds = monotonic() - started
    else
        ngx.update_time()
        seconds = ngx.now() - ngx.req.start_time()
    end
    local series = model .. "\t" .. (version or "") .. "\t" .. role
    local class = ngx.ctx.modelyard_malformed and "4xx" or string.format("%dxx", math.floor(ngx.status / 100))
    metrics:incr("n\t" .. series .. "\t" .. class, 1, 0)
    metrics:incr("b\t" .. series .. "\t" .. bucket(seconds), 1, 0)
    metrics:incr("s\t" .. series, seconds, 0)
end

-- log_by_lua of a shadow copy (nginx logs a subrequest with log_subrequest on): its answer counts under the
-- shadow's version, role "shadow"; a copy that was never made (no start_shadow) counts nothing.
function M.shadow_done(model)
    local version = ngx.ctx.modelyard_shadow_version
    if version then
        M.observe(model, version, "shadow")
    end
end

-- A series of (model, version, role) at 0, unless it exists: so the first requests after a version starts
-- serving count as a rise from 0 (Prometheus's rate() and increase() need two samples).
function M.create(model, version, role)
    if not metrics then
        return
    end
    local series = model .. "\t" .. string.format("%d", version) .. "\t" .. role
    for _, class in ipairs(CLASSES) do
        metrics:add("n\t" .. series .. "\t" .. class, 0)
    end
    metrics:add("s\t" .. series, 0)
end

-- Every series of a route's versions: its stable and canary as routed and as pinned, its shadow as shadow.
function M.create_route(model, route)
    for _, role in ipairs({ "stable", "canary", "shadow" }) do
        local version = route[role]
        if type(version) == "number" then
            M.create(model, version, role)
            if role ~= "shadow" then
                M.create(model, version, "pinned")
            end
        end
    end
end

-- Whether `versions` of `model`, as the control socket's POST /series gives them, are a model name (a URI path
-- segment, which holds no tab: keys are tab separated) and a list of version numbers (whole, from 1).
local function valid_series(model, versions)
    if type(model) ~= "string" or model == "" or model:find("[\t/]") or type(versions) ~= "table" then
        return false
    end
    for i, version in pairs(versions) do
        if type(i) ~= "number" or type(version) ~= "number" or version < 1 or version % 1 ~= 0 then
            return false
        end
    end
    return true
end

-- content_by_lua of POST /series on the control socket: {"<model>": [version, ...]}, versions that start serving
-- without a route (the agent's plain deployments; a route's versions have theirs from create_route). Each gets its
-- series at 0 as a routed stable version does, as routed ("stable": the role of a model without a route's answers,
-- modelyard_gateway.lua's done) and as pinned; answers the same object. Idempotent: an existing series keeps its
-- counts. 400 for a body that is not such an object, 405 for another method.
function M.control()
    if ngx.req.get_method() ~= "POST" then
        return ngx.exit(405)
    end
    -- Required here: modelyard_routes requires this module.
    local body = require("modelyard_routes").request_json()
    local valid = type(body) == "table"
    for model, versions in pairs(valid and body or {}) do
        valid = valid and valid_series(model, versions)
    end
    if not valid then
        ngx.status = 400
        ngx.say("series must be a JSON object of model names, each with a list of version numbers")
        return
    end
    for model, versions in pairs(body) do
        for _, version in ipairs(versions) do
            M.create(model, version, "stable")
            M.create(model, version, "pinned")
        end
    end
    ngx.header["Content-Type"] = "application/json"
    ngx.say(next(body) and cjson.encode(body) or "{}")
end

local function label_value(text)
    return (text:gsub("\\", "\\\\"):gsub("\"", "\\\""):gsub("\n", "\\n"))
end

local function labels(model, version, role)
    return 'model="' .. label_value(model) .. '",version="' .. label_value(version) .. '",role="' .. role .. '"'
end

local function le(i)
    return i == INF and "+Inf" or string.format("%.5g", BUCKETS[i])
end

-- content_by_lua of GET /metrics: every series, in Prometheus's text format 0.0.4, sorted by its labels.
function M.expose()
    local requests, sums, buckets, order = {}, {}, {}, {}
    for _, key in ipairs(metrics and metrics:get_keys(0) or {}) do
        local kind, model, version, role, last = key:match("^(%a)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t?(.*)$")
        local value = kind and metrics:get(key)
        if value then
            local series = labels(model, version, role)
            if not sums[series] then
                sums[series], buckets[series], requests[series] = 0, {}, {}
                order[#order + 1] = series
            end
            if kind == "n" then
                requests[series][last] = value
            elseif kind == "b" then
                local i = tonumber(last)
                if i then
                    buckets[series][i] = value
                end
            elseif kind == "s" then
                sums[series] = value
            end
        end
    end
    table.sort(order)
    local out = {
        "# HELP modelyard_gateway_requests_total Requests the gateway answered, by model, version, route role"
            .. " and status class.",
        "# TYPE modelyard_gateway_requests_total counter",
    }
    for _, series in ipairs(order) do
        local classes = {}
        for class in pairs(requests[series]) do
            classes[#classes + 1] = class
        end
        table.sort(classes)
        for _, class in ipairs(classes) do
            out[#out + 1] = string.format('modelyard_gateway_requests_total{%s,code="%s"} %d', series, class,
                requests[series][class])
        end
    end
    out[#out + 1] = "# HELP modelyard_gateway_request_duration_seconds Latency of the requests the gateway"
        .. " answered, from their rewrite phase to their log phase, in seconds."
    out[#out + 1] = "# TYPE modelyard_gateway_request_duration_seconds histogram"
    for _, series in ipairs(order) do
        local cumulative = 0
        for i = 1, INF do
            cumulative = cumulative + (buckets[series][i] or 0)
            out[#out + 1] = string.format('modelyard_gateway_request_duration_seconds_bucket{%s,le="%s"} %d',
                series, le(i), cumulative)
        end
        out[#out + 1] = string.format("modelyard_gateway_request_duration_seconds_sum{%s} %.9g", series,
            sums[series])
        out[#out + 1] = string.format("modelyard_gateway_request_duration_seconds_count{%s} %d", series,
            cumulative)
    end
    for _, line in ipairs(require("modelyard_residency").exposition()) do
        out[#out + 1] = line
    end
    for _, line in ipairs(require("modelyard_keys").exposition()) do
        out[#out + 1] = line
    end
    ngx.header["Content-Type"] = "text/plain; version=0.0.4; charset=utf-8"
    ngx.print(table.concat(out, "\n"), "\n")
end

return M
