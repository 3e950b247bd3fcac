-- Request body limits of a Triton host's gateway (modelyard_agent/runtimes/gateway.py writes the nginx config
-- that loads this module): the most bytes an infer request body to each model may hold, in the shared dict
-- "modelyard_limits", one entry per model, {"iris": 17408}, beside the host's default for models without one
-- (the agent's --max-request-bytes, written into the config, which client_max_body_size also bounds).
-- The models' come from <gateway dir>/limits.json when nginx starts and from its control socket afterwards
-- (PATCH /limits with the models that changed, POST /limits with every model's) (the agent derives each from the model's signature, formats.request_limits), so a new
-- limit needs no reload.
--
-- A body over its model's limit never reaches Triton: older tritonservers crash on crafted or oversized
-- bodies (SECURITY.md). A request that declares its length is refused before anything of its body is read;
-- a chunked one is read first (by nginx, bounded by client_max_body_size), then counted. Every body reaches
-- Triton with a Content-Length, never chunked (proxy_request_buffering on, in the gateway's config).
local cjson = require("cjson.safe")
local routes = require("modelyard_routes")

local M = {}
local limits = ngx.shared.modelyard_limits
local DEFAULT = "\0default"  -- not a model name (names have no NUL)

local function bytes(value)
    return type(value) == "number" and value >= 1 and value == math.floor(value)
end

-- Set the limits of `table` ({model: bytes}, or null: the host's default again; `removable` allows null);
-- returns how many were set, or nil and a message when one is malformed (then nothing is set) or finds no room.
-- `before` runs once the table is found well formed.
local function store(table, removable, before)
    return routes.store_table(table, removable, bytes, { "limits", "the limit", "a whole number of bytes, 1 or more" },
        before, function(model, limit)
            if limit == cjson.null then
                limits:delete(model)
                return true
            end
            return limits:safe_set(model, limit)
        end)
end

-- Replace every model's limit with those of `table` ({model: bytes}); returns nil and a message when one is
-- malformed. The host's default stays.
function M.apply(table)
    return store(table, false, function()
        local default = limits:get(DEFAULT)
        limits:flush_all()
        limits:set(DEFAULT, default)
    end)
end

-- Change the limits of the models `table` names ({model: bytes or null}), leaving the others.
function M.patch(table)
    return store(table, true, function() end)
end

-- At start and on reload (init_by_lua): the host's default (bytes) and the models' limits the agent last wrote.
function M.load(path, default)
    limits:set(DEFAULT, default)
    routes.load_file(path, M.apply, "request limits")
end

-- The limit of `model`'s infer request bodies in bytes, and whether it is the model's own (false: the host's
-- default); nil before any limits were set.
function M.limit_of(model)
    local own = limits:get(model)
    if own then
        return own, true
    end
    return limits:get(DEFAULT), false
end

local function refuse(model, size, limit, own)
    ngx.status = 413
    ngx.header["Content-Type"] = "application/json"
    ngx.header["Connection"] = "close"  -- the rest of a declared body is not read
    ngx.say(cjson.encode({
        error = string.format("request body of %d bytes is over the limit of %d bytes for %s (%s)", size, limit,
            model, own and "derived from its signature, or set by its deployment" or "the default of this host"),
        model = model, limit_bytes = limit, body_bytes = size,
    }))
    return ngx.exit(ngx.HTTP_OK)
end

-- rewrite_by_lua of the infer locations, before anything else reads the body: refuse a body over `model`'s
-- limit with 413 and a JSON body naming it.
function M.check(model)
    local limit, own = M.limit_of(model)
    if not limit then
        return
    end
    local declared = tonumber(ngx.var.http_content_length)
    if declared then
        if declared > limit then
            return refuse(model, declared, limit, own)
        end
        return
    end
    ngx.req.read_body()
    local data, size = ngx.req.get_body_data(), 0
    if data then
        size = #data
    else
        local path = ngx.req.get_body_file()
        local file = path and io.open(path, "rb")
        if file then
            size = file:seek("end")
            file:close()
        end
    end
    if size > limit then
        return refuse(model, size, limit, own)
    end
end

-- content_by_lua of the control socket: GET /limits answers {"default": bytes, "models": {model: bytes}}, POST
-- /limits replaces the models' with the JSON object it carries ({model: bytes}), PATCH /limits changes those it
-- names ({model: bytes or null}) and answers with them alone.
function M.control()
    local named = routes.patch_from_request(M.patch)
    if not (named and routes.replace_from_request(M.apply)) then
        return
    end
    named = named ~= true and named or nil
    local models = {}
    for _, model in ipairs(named and {} or limits:get_keys(0)) do
        models[model] = model ~= DEFAULT and limits:get(model) or nil
    end
    for model in pairs(named or {}) do
        models[model] = limits:get(model)
    end
    ngx.header["Content-Type"] = "application/json"
    -- An empty Lua table encodes as [] in cjson; the models are an object.
    local encoded_models = next(models) and cjson.encode(models) or "{}"
    ngx.say('{"default": ', cjson.encode(limits:get(DEFAULT) or cjson.null), ', "models": ', encoded_models, '}')
end

return M
