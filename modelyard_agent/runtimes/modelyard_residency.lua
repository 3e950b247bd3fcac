-- Models on demand at a Triton host's gateway (modelyard_agent/residency.py is the agent's side). A model
-- registered "on_demand" need not be loaded in Triton: a request for it while it is not resident is held in
-- its rewrite phase, the host agent's loader is asked (once, however many requests wait) to load it, and the
-- request goes on once the model is resident; past its model's cold_start_timeout, with its model's queue of
-- held requests full, after a failed load or with no loader polling, it is answered 503 with Retry-After and
-- a JSON body saying why. Models not registered here are always resident and pass untouched.
--
-- The agent's loader long-polls GET /residency/wanted on the control socket for the models held requests
-- wait for, loads them (evicting others first when its memory budget needs it) and reports each model's
-- state with PUT /residency/state. Evicting a model is: state "evicting" (new requests are held), wait until
-- no request is in flight on it (modelyard_routes.lua counts them), unload, state "cold". A request counts
-- itself in flight before it reads the state again (gateway.lua's route), so either the agent sees it in
-- flight or the request sees "evicting" and is held: none reaches Triton after the unload.
--
-- Keys of the shared dict "modelyard_residency", tab separated (model names hold no tab):
--   "\0settings"       JSON {model: {pinned, cold_start_timeout, max_held}}: the models registered on demand
--   "\0generation"     bumped by every change of "\0settings": a request reads this number, not the whole JSON
--   "\0budget"         JSON {budget_bytes, resident_bytes} the agent last reported
-- The shared dict "modelyard_wants" holds what the loader's long poll reads, so that its check for work takes a
-- lock no request but a held one takes:
--   "polled"           when the loader last polled (ngx.now(), seconds)
--   "wants"            a list of the models wanted since the loader's last poll (the poll pops it rather than
--                      scanning every key; an entry whose want was taken or ended meanwhile is skipped)
-- A held request that adds a want also wakes a long poll waiting in its own worker (a semaphore); one waiting
-- in another worker sees it at its next check, within WANTS_CHECK seconds.
--   "s\t<model>"       "resident", "cold" or "evicting"
--   "f\t<model>"       JSON {message, retry_after} of the last failed load, until its backoff expires
--   "w\t<model>"       when a held request first asked for the model (one load however many wait)
--   "t\t<model>"       the loader took the want
--   "h\t<model>"       requests held now; "H\t<model>\t<worker pid>" those of one worker (modelyard_workers.lua)
--   "u\t<model>"       when a request last asked for the model (the loader's recency)
--   metrics: "c\t<model>\t<i>" cold-start waits in bucket i, "cs\t<model>" their sum (seconds),
--            "l\t<model>\t<i>" and "ls\t<model>": the loader's loads, as long as Triton took (seconds),
--            "r\t<model>\t<outcome>" requests by outcome, "e\t<model>\t<reason>" evictions by reason
local cjson = require("cjson.safe")

local M = {}
local dict = ngx.shared.modelyard_residency
local SETTINGS, BUDGET, POLLED, WANTS = "\0settings", "\0budget", "polled", "wants"
local wants = ngx.shared.modelyard_wants
local woken = require("ngx.semaphore").new(0)
local WANTS_CHECK = 0.002
local GENERATION = "\0generation"

-- A held request polls its model's state this often (seconds), so it goes on within POLL of the load's end.
local POLL = 0.002
local MAX_POLL = 0.01
-- A loader that has not polled for this many seconds is taken for dead: held requests are answered at once.
M.LOADER_STALE = 3
M.DEFAULT_TIMEOUT, M.DEFAULT_MAX_HELD = 30, 256
-- Upper bounds of the cold-start buckets, in seconds (+Inf follows).
M.BUCKETS = { 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120 }
local OUTCOMES = { "hit", "cold", "timeout", "queue_full", "load_failed", "no_loader" }
local STATES = { resident = true, cold = true, evicting = true }

local cached, cached_generation = {}, nil

-- The model's on-demand settings, or nil for a model that is always resident. Each worker keeps them decoded and
-- reads them again only when the generation changed (the generation first: settings read after it are as new).
function M.settings(model)
    if not dict then
        return nil
    end
    local generation = dict:get(GENERATION)
    if generation ~= cached_generation then
        cached, cached_generation = cjson.decode(dict:get(SETTINGS) or "{}") or {}, generation
    end
    return cached[model]
end

-- Add `n` to the requests held for `model`, in all and in this worker; returns the total.
local function held_add(model, n)
    dict:incr("H\t" .. model .. "\t" .. ngx.worker.pid(), n, 0)
    return dict:incr("h\t" .. model, n, 0)
end

-- init_worker_by_lua: the requests that workers which died were holding are no longer held.
function M.worker_started()
    require("modelyard_workers").give_back(dict, "^H\t(.*)\t(%d+)$", "h\t")
end

local function count(model, outcome)
    dict:incr("r\t" .. model .. "\t" .. outcome, 1, 0)
end

-- Count `seconds` in histogram `kind` ("c" cold-start waits, "l" loads, "x" failed loads): bucket
-- "<kind>\t<model>\t<i>", sum "<kind>s\t<model>".
local function observe(kind, model, seconds)
    local i = #M.BUCKETS + 1
    for j, bound in ipairs(M.BUCKETS) do
        if seconds <= bound then
            i = j
            break
        end
    end
    dict:incr(kind .. "\t" .. model .. "\t" .. i, 1, 0)
    dict:incr(kind .. "s\t" .. model, seconds, 0)
end

-- Answer 503 with Retry-After (whole seconds) and {"error", "model", "reason", "retry_after"}; ends the request.
local function refuse(model, reason, message, retry_after)
    count(model, reason)
    retry_after = math.max(1, math.ceil(retry_after or 1))
    ngx.status = 503
    ngx.header["Content-Type"] = "application/json"
    ngx.header["Retry-After"] = string.format("%d", retry_after)
    ngx.say(cjson.encode({ error = message, model = model, reason = reason, retry_after = retry_after }))
    return ngx.exit(ngx.HTTP_OK)
end

local function failure(model)
    local text = dict:get("f\t" .. model)
    return text and cjson.decode(text)
end

-- Wait until `model` is resident, or say why not: nil when resident, else reason, message, retry_after.
local function wait(model, settings, deadline)
    local poll = POLL
    while true do
        ngx.update_time()
        local now = ngx.now()
        if dict:get("s\t" .. model) == "resident" then
            return nil
        end
        local failed = failure(model)
        if failed then
            return "load_failed", "loading " .. model .. " failed: " .. tostring(failed.message), failed.retry_after
        end
        if now - (wants:get(POLLED) or 0) > M.LOADER_STALE then
            return "no_loader", "the host agent's loader is not running, so " .. model .. " cannot be loaded", 5
        end
        if now >= deadline then
            return "timeout", model .. " did not become resident within its cold-start timeout of "
                .. settings.cold_start_timeout .. " s", settings.cold_start_timeout
        end
        if dict:add("w\t" .. model, now) then
            if not wants:rpush(WANTS, model) then
                dict:delete("w\t" .. model)  -- the list is full: wanted again at this request's next check
            elseif woken:count() < 0 then  -- a long poll waits in this worker
                woken:post(1)
            end
        end
        ngx.sleep(math.min(poll, math.max(0.001, deadline - now)))
        poll = math.min(poll * 1.5, MAX_POLL)
    end
end

-- rewrite_by_lua, before the request is counted in flight: return at once for a model that is always resident
-- or resident now; otherwise hold the request until its model is (its answer then carries
-- X-Modelyard-Cold-Start: the seconds it was held), or answer 503 (refuse). `started` (ngx.now() seconds;
-- now when nil): when the request began to wait, so that a request held again (its model was evicted between
-- two holds) waits until its first hold's deadline, not a whole cold_start_timeout more.
function M.hold(model, started)
    local settings = M.settings(model)
    if not settings then
        return
    end
    ngx.update_time()
    local now = ngx.now()
    started = started or now
    dict:set("u\t" .. model, now)
    if dict:get("s\t" .. model) == "resident" then
        count(model, "hit")
        return
    end
    settings.cold_start_timeout = settings.cold_start_timeout or M.DEFAULT_TIMEOUT
    local held = held_add(model, 1)
    if held > (settings.max_held or M.DEFAULT_MAX_HELD) then
        held_add(model, -1)
        return refuse(model, "queue_full", held - 1 .. " requests already wait for " .. model
            .. " to load (its queue holds " .. (settings.max_held or M.DEFAULT_MAX_HELD) .. ")", 1)
    end
    -- A client that closes its connection while held gives its place back at once (lua_check_client_abort is on
    -- in the inference locations), rather than keeping it until its timeout and then reaching Triton for no one.
    local ctx = ngx.ctx
    ctx.modelyard_held = model
    if not ctx.modelyard_abort_handled then
        ctx.modelyard_abort_handled = true
        ngx.on_abort(function()
            if ngx.ctx.modelyard_held then
                held_add(ngx.ctx.modelyard_held, -1)
                ngx.ctx.modelyard_held = nil
            end
            return ngx.exit(499)
        end)
    end
    local reason, message, retry_after = wait(model, settings, started + settings.cold_start_timeout)
    ctx.modelyard_held = nil
    held_add(model, -1)
    if reason then
        return refuse(model, reason, message, retry_after)
    end
    ngx.update_time()
    local waited = ngx.now() - started
    observe("c", model, waited)
    count(model, "cold")
    -- The answer says how long the request was held (seconds), so clients can tell a cold start.
    ngx.header["X-Modelyard-Cold-Start"] = string.format("%.3f", waited)
end

-- Whether a request counted in flight on `model` may go on to Triton: the model is always resident, or
-- resident still (an eviction that began meanwhile sees the request in flight and waits for it).
function M.still_resident(model)
    return not M.settings(model) or dict:get("s\t" .. model) == "resident"
end

-- header_filter_by_lua of an inference request for `model` (before its client sees the status, so the client's
-- next request finds the model cold, whichever worker takes it): Triton's answer says it holds no ready version of an
-- on-demand model read as resident (503: the version is not at ready state; 404 to a request that named no
-- version: no available versions), so Triton dropped it on its own (an unload through its API, a crashed
-- backend): the model reads cold at once, and the next request is held and loads it again, rather than failing
-- too until the agent's reconciliation (every 2 s) notices. `named`: the request named its version, whose 404
-- (a version that does not exist) changes nothing, so clients cannot make a resident model cold.
function M.answered(model, status, named)
    if (status == 503 or (status == 404 and not named)) and M.settings(model)
            and dict:get("s\t" .. model) == "resident" then
        dict:set("s\t" .. model, "cold")
    end
end

-- The agent's reports (control socket).

local function answer(text)
    ngx.header["Content-Type"] = "application/json"
    ngx.say(text)
end

local function bad(message)
    ngx.status = 400
    ngx.say(message)
end

-- A registered model's state, holds, recency and failure, given its settings.
local function described(model, entry)
    local requests = 0
    for _, outcome in ipairs(OUTCOMES) do
        requests = requests + (dict:get("r\t" .. model .. "\t" .. outcome) or 0)
    end
    return {
        pinned = entry.pinned == true, state = dict:get("s\t" .. model) or "cold", requests = requests,
        held = dict:get("h\t" .. model) or 0, last_used = dict:get("u\t" .. model) or cjson.null,
        wanted = dict:get("w\t" .. model) ~= nil, failure = failure(model) or cjson.null,
        cold_start_timeout = entry.cold_start_timeout or M.DEFAULT_TIMEOUT,
        max_held = entry.max_held or M.DEFAULT_MAX_HELD,
    }
end

-- Every registered model, described, as JSON: {models: {model: {...}}, budget: {...}}; only those of `only`
-- ({model: true}) when given.
local function snapshot(only)
    local models = {}
    local settings = cjson.decode(dict:get(SETTINGS) or "{}") or {}
    for model, entry in pairs(settings) do
        if not only or only[model] then
            models[model] = described(model, entry)
        end
    end
    local budget = dict:get(BUDGET)
    -- Encoded by hand: an empty Lua table would encode as [] (Debian's lua-cjson has no empty_table).
    return '{"models": ' .. (next(models) and cjson.encode(models) or "{}") .. ', "budget": '
        .. (budget and budget ~= "{}" and budget or "{}") .. "}"
end

-- The host's memory budget and what the resident models hold, when a report carries them.
local function keep_budget(body)
    if type(body.budget) == "table" then
        dict:set(BUDGET, cjson.encode(body.budget))
    end
end

-- A loader that starts: the wants a loader before it took and never answered (an agent that died meanwhile)
-- are handed out again, and it counts as alive from now on, before its first long poll.
local function forget_taken()
    ngx.update_time()
    wants:set(POLLED, ngx.now())
    for _, key in ipairs(dict:get_keys(0)) do
        if key:sub(1, 2) == "t\t" then
            dict:delete(key)
        elseif key:sub(1, 2) == "w\t" then
            wants:rpush(WANTS, key:sub(3))
        end
    end
    return true
end

-- nil when body.models is {model: settings} (`removable`: or null, a model to unregister), else why not.
local function invalid(body, removable)
    if type(body) ~= "table" or type(body.models) ~= "table" then
        return "residency must be {\"models\": {model: {pinned, cold_start_timeout, max_held}}}"
    end
    for model, entry in pairs(body.models) do
        if not (removable and entry == cjson.null) and (type(model) ~= "string" or type(entry) ~= "table"
                or (entry.cold_start_timeout ~= nil and (type(entry.cold_start_timeout) ~= "number"
                    or entry.cold_start_timeout <= 0))
                or (entry.max_held ~= nil and (type(entry.max_held) ~= "number" or entry.max_held < 1))
                or (entry.state ~= nil and not STATES[entry.state])) then
            return "residency of " .. tostring(model)
                .. " must be {pinned, cold_start_timeout > 0, max_held >= 1, state resident|cold|evicting}"
        end
    end
end

-- Put body.models' entries into `settings` ({model: settings}; null removes the model), set the states given,
-- store the settings and bump their generation; true, or nil and why.
local function store(settings, body)
    for model, entry in pairs(body.models) do
        if entry == cjson.null then
            settings[model] = nil
        else
            settings[model] = { pinned = entry.pinned == true, cold_start_timeout = entry.cold_start_timeout,
                                max_held = entry.max_held }
            if entry.state then
                dict:set("s\t" .. model, entry.state)
            end
            for _, outcome in ipairs(OUTCOMES) do
                dict:add("r\t" .. model .. "\t" .. outcome, 0)
            end
            dict:add("cs\t" .. model, 0)
        end
    end
    local ok, err = dict:safe_set(SETTINGS, next(settings) and cjson.encode(settings) or "{}")
    if not ok then
        return nil, "no room for the residency settings: " .. err
    end
    dict:incr(GENERATION, 1, 0)
    keep_budget(body)
    return true
end

-- POST /residency {"models": {model: {pinned, cold_start_timeout, max_held, state?}}, "budget": {...}}:
-- replace the registered models (a model left out is always resident again); "state" sets where given. The full
-- resync (a gateway that starts reads the same from residency.json).
local function register(body)
    local err = invalid(body, false)
    if err then
        return nil, err
    end
    forget_taken()
    return store({}, body)
end

-- PATCH /residency {"models": {model: {pinned, cold_start_timeout, max_held, state?} or null}, "budget"?}: register
-- or change the models named (null: always resident again), leaving the others as they are: one model's change
-- is one model's body. Returns true and the models named, for the answer. A read-modify-write of "\0settings":
-- the agent sends its changes one at a time per host (ResidencyControl holds the gateway's flock).
local function change(body)
    local err = invalid(body, true)
    if err then
        return nil, err
    end
    local ok, stored = store(cjson.decode(dict:get(SETTINGS) or "{}") or {}, body)
    if not ok then
        return nil, stored
    end
    local named = {}
    for model in pairs(body.models) do
        named[model] = true
    end
    return true, named
end

-- PUT /residency/state {"model", "state", "reason"?, "failure"?: {message, retry_after}, "budget"?,
-- "abandoned"?, "load_seconds"?}: the loader's report of one model, answered with that model alone (a load's
-- seconds: loaded, or with a failure, failed). "resident", a failure or "abandoned" (no request waits for it
-- any more, so it is not loaded) ends the want; "cold" with a reason counts an eviction.
local function report(body)
    if type(body) ~= "table" or type(body.model) ~= "string" then
        return nil, "a state report is {model, state, reason?, failure?: {message, retry_after}}"
    end
    local model = body.model
    if body.state ~= nil then
        if not STATES[body.state] then
            return nil, "state must be resident, cold or evicting"
        end
        dict:set("s\t" .. model, body.state)
        if body.state == "cold" and type(body.reason) == "string" then
            dict:incr("e\t" .. model .. "\t" .. body.reason, 1, 0)
        end
    end
    if type(body.load_seconds) == "number" and body.load_seconds >= 0 and M.settings(model) then
        observe(type(body.failure) == "table" and "x" or "l", model, body.load_seconds)
    end
    if type(body.failure) == "table" then
        local retry_after = tonumber(body.failure.retry_after) or 1
        dict:set("f\t" .. model, cjson.encode({ message = tostring(body.failure.message),
                                                retry_after = retry_after }), retry_after)
    end
    if body.state == "resident" or type(body.failure) == "table" or body.abandoned == true then
        dict:delete("w\t" .. model)
        dict:delete("t\t" .. model)
    end
    keep_budget(body)
    return true, { [model] = true }
end

-- The models held requests wait for that the loader has not taken yet, each marked taken, and how long ago the
-- oldest was first wanted (seconds). Popped from the wants list, so a poll costs the same however many models are
-- registered, and one that finds none takes no lock but the wants dict's.
local function take_wanted()
    local out, oldest = {}, nil
    while true do
        local model = wants:lpop(WANTS)
        if not model then
            return out, oldest
        end
        local since = dict:get("w\t" .. model)
        if since and dict:add("t\t" .. model, ngx.now()) then
            out[#out + 1] = model
            oldest = math.min(oldest or since, since)
        end
    end
end

-- GET /residency/wanted?wait=<seconds>: the loader's long poll. Answers as soon as a model is wanted, or with
-- [] after `wait` seconds (at most 30); while it waits the loader counts as alive. X-Modelyard-Wanted-Age: how
-- long (seconds, nginx's millisecond clock) the oldest model answered was wanted before the poll took it.
local function wanted()
    local wait = math.min(tonumber(ngx.var.arg_wait) or 0, 30)
    ngx.update_time()
    local deadline = ngx.now() + wait
    while true do
        wants:set(POLLED, ngx.now())
        local models, oldest = take_wanted()
        if #models > 0 or ngx.now() >= deadline then
            ngx.header["Content-Type"] = "application/json"
            if oldest then
                ngx.header["X-Modelyard-Wanted-Age"] = string.format("%.3f", math.max(0, ngx.now() - oldest))
            end
            ngx.say(#models > 0 and cjson.encode(models) or "[]")
            return
        end
        woken:wait(WANTS_CHECK)
        ngx.update_time()
    end
end

-- content_by_lua of /residency and /residency/<what> on the control socket.
function M.control()
    local uri, method = ngx.var.uri, ngx.req.get_method()
    if uri == "/residency/wanted" then
        return wanted()
    end
    if uri == "/residency/taken" and method == "DELETE" then
        forget_taken()
        return answer(snapshot())
    end
    local apply = nil
    if uri == "/residency" and method == "POST" then
        apply = register
    elseif uri == "/residency" and method == "PATCH" then
        apply = change
    elseif uri == "/residency/state" and method == "PUT" then
        apply = report
    elseif not (uri == "/residency" and method == "GET") then
        ngx.status = 404
        ngx.say("the residency endpoints are GET|POST|PATCH /residency, PUT /residency/state, "
            .. "GET /residency/wanted, DELETE /residency/taken")
        return
    end
    local only = nil
    if apply then
        local ok, named = apply(require("modelyard_routes").request_json())
        if not ok then
            return bad(named)
        end
        only = type(named) == "table" and named or nil
    end
    answer(snapshot(only))
end

-- At start and on reload (init_by_lua): the registered models the agent last wrote, every one cold (a new
-- nginx knows nothing of what Triton holds; the agent's loader reports the residents when it starts).
function M.load(path)
    local file = io.open(path, "r")
    if not file then
        return
    end
    local body = cjson.decode(file:read("*a"))
    file:close()
    if type(body) == "table" and type(body.models) == "table" then
        for _, entry in pairs(body.models) do
            if type(entry) == "table" then
                entry.state = nil
            end
        end
    end
    local ok, err = register(body)
    if not ok then
        ngx.log(ngx.ERR, "residency in ", path, " ignored: ", err)
    end
end

-- Lines of the exposition (modelyard_metrics.lua's expose appends them): registered and resident models, the
-- memory budget, requests by outcome, cold-start waits and evictions.
local function label_value(text)
    return (text:gsub("\\", "\\\\"):gsub("\"", "\\\""):gsub("\n", "\\n"))
end

-- Append to `out` a metric family: its HELP and TYPE lines, then its sample `lines`, sorted.
local function family(out, name, kind, help, lines)
    table.sort(lines)
    out[#out + 1] = "# HELP " .. name .. " " .. help
    out[#out + 1] = "# TYPE " .. name .. " " .. kind
    for _, line in ipairs(lines) do
        out[#out + 1] = line
    end
end

function M.exposition()
    if not dict then
        return {}
    end
    local settings = cjson.decode(dict:get(SETTINGS) or "{}") or {}
    local resident, registered = 0, 0
    for model in pairs(settings) do
        registered = registered + 1
        if dict:get("s\t" .. model) == "resident" then
            resident = resident + 1
        end
    end
    local budget = cjson.decode(dict:get(BUDGET) or "{}") or {}
    local out = {
        "# HELP modelyard_on_demand_models Models registered on demand on this host, by whether they are resident.",
        "# TYPE modelyard_on_demand_models gauge",
        string.format('modelyard_on_demand_models{state="resident"} %d', resident),
        string.format('modelyard_on_demand_models{state="cold"} %d', registered - resident),
    }
    if type(budget.budget_bytes) == "number" then
        out[#out + 1] = "# HELP modelyard_memory_budget_bytes The memory on-demand models may hold on each device."
        out[#out + 1] = "# TYPE modelyard_memory_budget_bytes gauge"
        out[#out + 1] = string.format("modelyard_memory_budget_bytes %d", budget.budget_bytes)
        out[#out + 1] = "# HELP modelyard_resident_bytes Footprints of the on-demand models resident now, on the "
            .. "fullest device."
        out[#out + 1] = "# TYPE modelyard_resident_bytes gauge"
        out[#out + 1] = string.format("modelyard_resident_bytes %d", budget.resident_bytes or 0)
        -- The agent's devices (GPU uuids, cpu): a few, never from a client.
        local devices = {}
        for device, bytes in pairs(type(budget.devices) == "table" and budget.devices or {}) do
            if type(device) == "string" and type(bytes) == "number" then
                devices[#devices + 1] = string.format('modelyard_device_resident_bytes{device="%s"} %d',
                    label_value(device), bytes)
            end
        end
        if #devices > 0 then
            family(out, "modelyard_device_resident_bytes", "gauge", "Footprints of the on-demand models resident "
                .. "now, per device (a GPU's uuid, or cpu).", devices)
        end
    end
    local requests, evictions = {}, {}
    -- What observe() counted, per kind: buckets[model][i], sums[model] and the models, for histogram() below.
    local histograms = { c = { buckets = {}, sums = {}, models = {} }, l = { buckets = {}, sums = {}, models = {} },
                         x = { buckets = {}, sums = {}, models = {} } }
    for _, key in ipairs(dict:get_keys(0)) do
        local kind, model, last = key:match("^(%a%a?)\t([^\t]*)\t?(.*)$")
        local value = kind and dict:get(key)
        if kind == "r" then
            requests[#requests + 1] = string.format('modelyard_on_demand_requests_total{model="%s",outcome="%s"} %d',
                label_value(model), last, value)
        elseif kind == "e" then
            evictions[#evictions + 1] = string.format('modelyard_evictions_total{model="%s",reason="%s"} %d',
                label_value(model), label_value(last), value)
        elseif histograms[kind] then
            local buckets = histograms[kind].buckets
            buckets[model] = buckets[model] or {}
            buckets[model][tonumber(last)] = value
        elseif kind and #kind == 2 and kind:sub(2) == "s" and histograms[kind:sub(1, 1)] then
            local counted = histograms[kind:sub(1, 1)]
            counted.sums[model] = value
            counted.models[#counted.models + 1] = model
        end
    end
    for _, counted in pairs(histograms) do
        table.sort(counted.models)
    end
    family(out, "modelyard_on_demand_requests_total", "counter", "Requests for on-demand models: hit (resident),"
        .. " cold (held until loaded), or answered 503 (timeout, queue_full, load_failed, no_loader).", requests)
    family(out, "modelyard_evictions_total", "counter", "Models the host agent unloaded to make room, by reason.",
        evictions)
    -- One family `name` from `parts`: {counted (a kind of `histograms`), labels after the model's}, in turn.
    local function histogram(name, help, parts)
        out[#out + 1] = "# HELP " .. name .. " " .. help
        out[#out + 1] = "# TYPE " .. name .. " histogram"
        for _, part in ipairs(parts) do
            local counted, extra = part[1], part[2]
            for _, model in ipairs(counted.models) do
                local cumulative, labels = 0, 'model="' .. label_value(model) .. '"' .. extra
                for i = 1, #M.BUCKETS + 1 do
                    cumulative = cumulative + ((counted.buckets[model] or {})[i] or 0)
                    local le = i > #M.BUCKETS and "+Inf" or string.format("%.5g", M.BUCKETS[i])
                    out[#out + 1] = string.format('%s_bucket{%s,le="%s"} %d', name, labels, le, cumulative)
                end
                out[#out + 1] = string.format('%s_sum{%s} %.9g', name, labels, counted.sums[model])
                out[#out + 1] = string.format('%s_count{%s} %d', name, labels, cumulative)
            end
        end
    end
    histogram("modelyard_cold_start_seconds", "How long requests for a model that was not resident were held until"
        .. " it was, in seconds.", { { histograms.c, "" } })
    histogram("modelyard_model_load_seconds", "How long the host agent's on-demand loads took in Triton, in seconds,"
        .. " by outcome: loaded, or failed (the wait beyond a load is modelyard_cold_start_seconds' share).",
        { { histograms.l, ',outcome="loaded"' }, { histograms.x, ',outcome="failed"' } })
    return out
end

return M
