-- Routing of a Triton host's gateway (modelyard_agent/runtimes/gateway.py writes the nginx config that
-- loads this module). Routes live in the shared dict "modelyard_routes", one entry per model:
--   {"stable": 3, "canary": 4, "percent": 10.0, "shadow": 5, "shadow_percent": 20.0}
-- (canary and shadow may be null).
-- They come from <gateway dir>/routes.json when nginx starts and from POST /routes on the gateway's
-- control socket afterwards, so a change of percent, a promotion or a rollback needs no reload.
local cjson = require("cjson.safe")

local M = {}
local routes = ngx.shared.modelyard_routes
local GENERATION = "\0generation"  -- bumped by every apply; not a model name (names have no NUL)

-- Each worker keeps the routes decoded, and decodes them again only when the generation changed.
local cached, cached_generation = {}, nil

local function current(model)
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

local function valid(route)
    return type(route) == "table" and type(route.stable) == "number" and version_or_null(route.canary)
        and percent(route.percent) and version_or_null(route.shadow)
        and (route.shadow_percent == nil or percent(route.shadow_percent))
end

-- Replace every route with those of `table` ({model: route}); returns nil and a message when one is malformed.
function M.apply(table)
    if type(table) ~= "table" then
        return nil, "routes must be a JSON object of model names"
    end
    for model, route in pairs(table) do
        if type(model) ~= "string" or not valid(route) then
            return nil, "route of " .. tostring(model)
                .. " must be {stable, canary, percent 0-100, shadow, shadow_percent 0-100}"
        end
    end
    local generation = (routes:get(GENERATION) or 0) + 1
    routes:flush_all()
    local count = 0
    for model, route in pairs(table) do
        local ok, err = routes:safe_set(model, cjson.encode(route))
        if not ok then
            return nil, "no room for the route of " .. model .. ": " .. err
        end
        count = count + 1
    end
    routes:set(GENERATION, generation)
    return count
end

-- At start and on reload (init_by_lua): the routes the agent last wrote.
function M.load(path)
    local file = io.open(path, "r")
    if not file then
        return
    end
    local text = file:read("*a")
    file:close()
    local count, err = M.apply(cjson.decode(text))
    if not count then
        ngx.log(ngx.ERR, "routes in ", path, " ignored: ", err)
    end
end

function M.seed()
    math.randomseed(ngx.now() * 1000 + ngx.worker.pid())
end

-- The share of requests that go to the canary: a routing key (header X-Modelyard-Routing-Key) is hashed
-- into 10,000 buckets, so the same key always lands on the same version while the percent stays, and
-- raising the percent only moves keys from the stable version to the canary; requests without one are
-- drawn at random.
local function takes_canary(percent)
    if percent <= 0 then
        return false
    end
    if percent >= 100 then
        return true
    end
    local key = ngx.var.http_x_modelyard_routing_key
    if key and key ~= "" then
        return ngx.crc32_long(key) % 10000 < percent * 100
    end
    return math.random() * 100 < percent
end

-- rewrite_by_lua for /v2/models/<model>/infer: a request that names no version goes to the version its
-- model's route picks, under /v2/models/<model>/versions/<v>/infer. Models without a route pass as sent.
function M.route(model)
    local route = current(model)
    if not route then
        return
    end
    local version = route.stable
    if type(route.canary) == "number" and takes_canary(route.percent) then
        version = route.canary
    end
    ngx.var.modelyard_version = version
    ngx.req.set_uri("/v2/models/" .. model .. "/versions/" .. string.format("%d", version) .. "/infer")
    -- A share of the requests is mirrored to the shadow (never the ones that went to that version itself):
    -- those continue in a location with nginx's mirror, the others in one without.
    local shadow = route.shadow
    if type(shadow) == "number" and shadow ~= version and math.random() * 100 < (route.shadow_percent or 0) then
        ngx.var.modelyard_shadow = string.format("%d", shadow)
        return ngx.exec("@modelyard_mirrored")
    end
end

-- rewrite_by_lua of the mirror subrequest of a request route() drew for its model's shadow: the copy goes to
-- /v2/models/<model>/versions/<shadow>/infer; nginx discards the answer, so a client never sees it.
function M.shadow()
    local model, shadow = ngx.var.modelyard_model, ngx.var.modelyard_shadow
    if not model or not shadow or shadow == "" then
        return ngx.exit(204)
    end
    ngx.req.set_uri("/v2/models/" .. model .. "/versions/" .. shadow .. "/infer")
end

-- content_by_lua of the control socket: GET /routes answers the routes, POST /routes replaces them.
function M.control()
    if ngx.req.get_method() == "POST" then
        ngx.req.read_body()
        local count, err = M.apply(cjson.decode(ngx.req.get_body_data() or ""))
        if not count then
            ngx.status = 400
            ngx.say(err)
            return
        end
    end
    local out = {}
    for _, model in ipairs(routes:get_keys(0)) do
        if model ~= GENERATION then
            out[model] = cjson.decode(routes:get(model))
        end
    end
    ngx.header["Content-Type"] = "application/json"
    ngx.say(next(out) and cjson.encode(out) or "{}")
end

return M
