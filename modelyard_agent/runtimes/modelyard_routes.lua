-- Per-model routes of a host's nginx, the scheme both runtimes use: the BentoML front
-- (modelyard_bento.lua, written by modelyard_agent/runtimes/nginx.py) and the Triton
-- gateway (modelyard_gateway.lua). Routes live in the shared dict "modelyard_routes", one entry per model:
--   {"stable": 3, "canary": 4, "percent": 10.0, "shadow": 4, "shadow_percent": 20.0, "ports": {"3": 41001, "4": 41002}}
-- (canary and shadow may be null; "ports", the loopback port serving each version, only on the BentoML front).
-- They come from <nginx dir>/routes.json when nginx starts and from its control socket afterwards (PATCH /routes
-- with the models that changed, POST /routes with every route), so a change of percent, a promotion or a
-- rollback needs no reload.
--
-- Requests a route gave a version are counted in flight per version in the shared dict "modelyard_inflight"
-- ("<model>/<version>"), from the moment they are given it until their log phase, so the agent stops or
-- unloads a version only once nothing is on its way to it (GET /inflight on the control socket).
local cjson = require("cjson.safe")
local metrics = require("modelyard_metrics")

local M = {}
local routes = ngx.shared.modelyard_routes
local inflight = ngx.shared.modelyard_inflight
local GENERATION = "\0generation"  -- bumped by every apply; not a model name (names have no NUL)

-- Each worker keeps the routes decoded, and decodes them again only when the generation changed.
local cached, cached_generation = {}, nil

-- The number of route changes so far (nil before the first): a request that read a route and then sees
-- another generation knows the route changed under it.
function M.generation()
    return routes:get(GENERATION)
end

function M.current(model)
    local generation = routes:get(GENERATION)
    if generation ~= cached_generation then
        local fresh = {}
        for _, key in ipairs(routes:get_keys(0)) do
            if key ~= GENERATION then
                fresh[key] = cjson.decode(routes:get(key))
            end
        end
        cached, cached_generation = fresh, generation
    end
    return cached[model]
end

local function version_or_null(value)
    return value == nil or value == cjson.null or type(value) == "number"
end

local function percent(value)
    return type(value) == "number" and value >= 0 and value <= 100
end

local function ports(value)
    if value == nil or value == cjson.null then
        return true
    end
    if type(value) ~= "table" then
        return false
    end
    for version, port in pairs(value) do
        if type(version) ~= "string" or not version:match("^%d+$") or type(port) ~= "number"
                or port < 1 or port > 65535 then
            return false
        end
    end
    return true
end

local function valid(route)
    return type(route) == "table" and type(route.stable) == "number" and version_or_null(route.canary)
        and percent(route.percent) and version_or_null(route.shadow)
        and (route.shadow_percent == nil or percent(route.shadow_percent)) and ports(route.ports)
end

-- nil when `table` is {model: setting} whose every setting `valid` takes (`removable`: or null, one to drop), else
-- why not: "<plural> must be a JSON object of model names" or "<singular> of <model> must be <shape>". The routes,
-- the request limits and the inference keys check their control bodies with it.
function M.invalid_table(table, removable, valid, plural, singular, shape)
    if type(table) ~= "table" then
        return plural .. " must be a JSON object of model names"
    end
    for model, setting in pairs(table) do
        if type(model) ~= "string" or not ((removable and setting == cjson.null) or valid(setting, model)) then
            return singular .. " of " .. tostring(model) .. " must be " .. shape
        end
    end
end

-- Check `table` as invalid_table does (`names`: {plural, singular, shape}), run `before`, then `put(model,
-- setting)` each (cjson.null: drop the model's); `put` answers as a shared dict's safe_set. Returns how many settings
-- (not null) were put, or nil and why.
function M.store_table(table, removable, valid, names, before, put)
    local err = M.invalid_table(table, removable, valid, names[1], names[2], names[3])
    if err then
        return nil, err
    end
    before()
    local count = 0
    for model, setting in pairs(table) do
        local ok, failed = put(model, setting)
        if not ok then
            return nil, "no room for " .. names[2] .. " of " .. model .. ": " .. failed
        end
        count = count + (setting == cjson.null and 0 or 1)
    end
    return count
end

local function invalid(table, removable)
    return M.invalid_table(table, removable, valid, "routes", "route",
        "{stable, canary, percent 0-100, shadow, shadow_percent 0-100, ports {version: port}}")
end

-- Set the routes of `table` (null drops one); the traffic series of each routed version are created at 0
-- (modelyard_metrics.lua's create_route). Returns how many were set, or nil and why.
local function store(table)
    local count = 0
    for model, route in pairs(table) do
        if route == cjson.null then
            routes:delete(model)
        else
            local ok, err = routes:safe_set(model, cjson.encode(route))
            if not ok then
                return nil, "no room for the route of " .. model .. ": " .. err
            end
            count = count + 1
            -- The series of each version routed start at 0 now (where the front measures: the Triton gateway).
            metrics.create_route(model, route)
        end
    end
    return count
end

-- Replace every route with those of `table` ({model: route}); returns nil and a message when one is malformed.
function M.apply(table)
    local err = invalid(table, false)
    if err then
        return nil, err
    end
    local generation = (routes:get(GENERATION) or 0) + 1
    routes:flush_all()
    local count, problem = store(table)
    routes:set(GENERATION, generation)
    return count, problem
end

-- Change the routes of the models `table` names ({model: route or null: no route}), leaving the others: one
-- model's change is one model's body. Returns how many routes were set, or nil and why.
function M.patch(table)
    local err = invalid(table, true)
    if err then
        return nil, err
    end
    local count, problem = store(table)
    routes:incr(GENERATION, 1, 0)
    return count, problem
end

-- At start and on reload (init_by_lua): give `apply` the JSON object the agent last wrote to `path`, if any;
-- what `apply` refuses is logged as `what` and ignored. Also used for the capture settings.
function M.load_file(path, apply, what)
    local file = io.open(path, "r")
    if not file then
        return
    end
    local text = file:read("*a")
    file:close()
    local count, err = apply(cjson.decode(text))
    if not count then
        ngx.log(ngx.ERR, what, " in ", path, " ignored: ", err)
    end
end

-- At start and on reload (init_by_lua): the routes the agent last wrote.
function M.load(path)
    M.load_file(path, M.apply, "routes")
end

-- init_worker_by_lua: this worker's own random draws, and the requests that workers which died (a signal, a
-- crash: no log phase ran) still counted in flight are forgotten, so no drain waits for them.
function M.worker_started()
    math.randomseed(ngx.now() * 1000 + ngx.worker.pid())
    require("modelyard_workers").forget(inflight, "^(.*)/(%d+)$")
end

-- Whether a request goes to the canary: a routing key (header X-Modelyard-Routing-Key) is hashed (CRC-32)
-- into 10,000 buckets, so the same key always lands on the same version while the percent stays, and
-- raising the percent only moves keys from the stable version to the canary; requests without one are
-- drawn at random.
function M.takes_canary(share)
    if share <= 0 then
        return false
    end
    if share >= 100 then
        return true
    end
    local key = ngx.var.http_x_modelyard_routing_key
    if key and key ~= "" then
        return ngx.crc32_long(key) % 10000 < share * 100
    end
    return math.random() * 100 < share
end

-- The version a request that names none goes to under `route`.
function M.pick(route)
    if type(route.canary) == "number" and M.takes_canary(route.percent) then
        return route.canary
    end
    return route.stable
end

-- Whether a shadow copy of this request (answered by `version`) goes to the route's shadow version.
function M.takes_shadow(route, version)
    return type(route.shadow) == "number" and route.shadow ~= version
        and math.random() * 100 < (route.shadow_percent or 0)
end

-- Count one request on the version `choose(route)` gives (nil: none), under a route that did not change
-- meanwhile: a request counted under an old route is counted again under the new one, so once the agent
-- changed a route and reads a version's count as 0, no request can still be given that version. Counts are
-- kept per worker ("<model>/<version>/<worker pid>"), so the agent ignores those of a worker that died.
-- Returns the route, the version and its counter's key (for `release`), or nil when `model` has no route
-- or choose gave nil.
function M.claim(model, choose)
    while true do
        local generation = M.generation()
        local route = M.current(model)
        if not route then
            return nil
        end
        local version = choose(route)
        if version == nil or not inflight then  -- no dict: an nginx started from a config without one
            return route, version
        end
        local key = model .. "/" .. string.format("%d", version) .. "/" .. string.format("%d", ngx.worker.pid())
        inflight:incr(key, 1, 0)
        if M.generation() == generation then
            return route, version, key
        end
        inflight:incr(key, -1, 0)
    end
end

-- Count one request in flight on `model` without a version ("<model>/*/<worker pid>"): an on-demand model's
-- request that no route gave a version (the model has no route, or the request names a version the route does
-- not give), so that an eviction of the model waits for it too. Returns its counter's key (for `release`).
-- The key is one per model and worker, whatever version a client names, so clients cannot add counters.
function M.claim_model(model)
    if not inflight then
        return nil
    end
    local key = model .. "/*/" .. string.format("%d", ngx.worker.pid())
    inflight:incr(key, 1, 0)
    return key
end

-- The request counted under `key` by `claim` ended (its log phase); nil or "" counts nothing.
function M.release(key)
    if key and key ~= "" and inflight then
        inflight:incr(key, -1, 0)
    end
end

-- content_by_lua of GET /inflight on the control socket: {"<model>/<version>/<worker pid>": requests in flight}.
function M.counts()
    local out = {}
    for _, key in ipairs(inflight and inflight:get_keys(0) or {}) do
        out[key] = inflight:get(key)
    end
    ngx.header["Content-Type"] = "application/json"
    ngx.say(next(out) and cjson.encode(out) or "{}")
end

-- Every route, as a JSON object; only those of the models `only` names ({model: anything}) when given.
function M.encoded(only)
    local out, models = {}, only and {} or routes:get_keys(0)
    for model in pairs(only or {}) do
        models[#models + 1] = model
    end
    for _, model in ipairs(models) do
        local route = model ~= GENERATION and routes:get(model)
        if route then
            out[model] = cjson.decode(route)
        end
    end
    return next(out) and cjson.encode(out) or "{}"
end

-- The JSON a control socket's request carries, decoded (nil when it is none). Read whole, from memory or from
-- the temporary file nginx wrote it to (a body larger than client_body_buffer_size: 2,000 models' routes).
function M.request_json()
    ngx.req.read_body()
    local data = ngx.req.get_body_data()
    if not data then
        local path = ngx.req.get_body_file()
        local file = path and io.open(path, "rb")
        if file then
            data = file:read("*a")
            file:close()
        end
    end
    return cjson.decode(data or "")
end

-- For a control socket's POST: give `apply` the JSON object the request carries; false (having answered 400
-- with `apply`'s message) when it refused it. Other methods change nothing and return true.
function M.replace_from_request(apply)
    if ngx.req.get_method() ~= "POST" then
        return true
    end
    local count, err = apply(M.request_json())
    if not count then
        ngx.status = 400
        ngx.say(err)
        return false
    end
    return true
end

-- For a control socket's PATCH: give `patch` the JSON object the request carries ({model: setting or null});
-- that object when `patch` took it (its models are the answer's), false when it refused it (answered 400 with its
-- message), true for another method.
function M.patch_from_request(patch)
    if ngx.req.get_method() ~= "PATCH" then
        return true
    end
    local body = M.request_json()
    local count, err = patch(body)
    if not count then
        ngx.status = 400
        ngx.say(err)
        return false
    end
    return body
end

-- content_by_lua of the control socket: GET /routes answers the routes, POST /routes replaces them, PATCH
-- /routes changes those it names and answers them alone (a dropped one is left out).
function M.control()
    local named = M.patch_from_request(M.patch)
    if not (named and M.replace_from_request(M.apply)) then
        return
    end
    ngx.header["Content-Type"] = "application/json"
    ngx.say(M.encoded(named ~= true and named or nil))
end

return M
