-- Request capture of a Triton host's gateway (modelyard_agent/runtimes/gateway.py writes the nginx config
-- that loads this module). Per model, the shared dict "modelyard_capture" holds
--   "cfg:<model>"      {"fraction": 0.05, "max_bytes": 268435456, "retention_seconds": 604800} (JSON)
--   "bytes:<model>"    bytes the model's capture directory holds (the agent sets it from disk each heartbeat)
--   "skipped:<model>"  sampled requests not captured (body not in memory, version unknown, full, no file)
-- Settings come from <gateway dir>/capture.json when nginx starts and from POST /capture on the control
-- socket afterwards. A request is drawn in the rewrite phase (draw) and written in the log phase (log), after
-- the answer went to the client: one line per request (capture_contract: id, time, model, version,
-- content_type, header_length, body in base64) to <gateway dir>/capture/<model>/<YYYYmmddHH>-<worker pid>.ndjson,
-- a file per worker, so lines of two workers never interleave.
local cjson = require("cjson.safe")

local M = {}
local store = ngx.shared.modelyard_capture
local GENERATION = "\0generation"  -- bumped by every change; workers then reopen their files

local directory = nil  -- <gateway dir>/capture, set by load()
local cached, cached_generation = {}, nil
local handles = {}  -- model -> {name = file name, file = open file}

local function current(model)
    local generation = store:get(GENERATION)
    if generation ~= cached_generation then
        local fresh = {}
        for _, key in ipairs(store:get_keys(0)) do
            local name = key:match("^cfg:(.+)$")
            if name then
                fresh[name] = cjson.decode(store:get(key))
            end
        end
        for _, open in pairs(handles) do
            open.file:close()
        end
        handles = {}
        cached, cached_generation = fresh, generation
    end
    return cached[model]
end

local function valid(cfg)
    return type(cfg) == "table" and type(cfg.fraction) == "number" and cfg.fraction >= 0 and cfg.fraction <= 1
        and type(cfg.max_bytes) == "number" and cfg.max_bytes >= 0
        and type(cfg.retention_seconds) == "number" and cfg.retention_seconds > 0
end

-- Replace every model's settings with those of `table` ({model: settings}); returns nil and a message when
-- one is malformed (nothing changes then).
function M.apply(table)
    if type(table) ~= "table" then
        return nil, "capture settings must be a JSON object of model names"
    end
    for model, cfg in pairs(table) do
        if type(model) ~= "string" or model:find("[/%z]") or model == "." or model == ".." or not valid(cfg) then
            return nil, "capture settings of " .. tostring(model)
                .. " must be {fraction 0-1, max_bytes >= 0, retention_seconds > 0}"
        end
    end
    for _, key in ipairs(store:get_keys(0)) do
        local kind, model = key:match("^(%a+):(.+)$")
        -- A model whose capture goes off loses its counters too (its files are deleted), so turning it on
        -- again starts from nothing.
        if kind == "cfg" or ((kind == "bytes" or kind == "skipped") and table[model] == nil) then
            store:delete(key)
        end
    end
    local count = 0
    for model, cfg in pairs(table) do
        local ok, err = store:safe_set("cfg:" .. model, cjson.encode(cfg))
        if not ok then
            return nil, "no room for the capture settings of " .. model .. ": " .. err
        end
        count = count + 1
    end
    store:incr(GENERATION, 1, 0)
    return count
end

-- At start and on reload (init_by_lua): the settings the agent last wrote.
function M.load(dir)
    directory = dir .. "/capture"
    require("modelyard_routes").load_file(dir .. "/capture.json", M.apply, "capture settings")
end

local function skip(model)
    store:incr("skipped:" .. model, 1, 0)
end

local function file_of(model)
    local name = os.date("!%Y%m%d%H") .. "-" .. ngx.worker.pid() .. ".ndjson"
    local open = handles[model]
    if open and open.name == name then
        return open.file
    end
    if open then
        open.file:close()
        handles[model] = nil
    end
    local file = io.open(directory .. "/" .. model .. "/" .. name, "a")
    if not file then
        return nil  -- no directory: the agent has not made it yet, or capture was just turned off
    end
    file:setvbuf("full", 65536)
    handles[model] = {name = name, file = file}
    return file
end

-- rewrite_by_lua of a client's /v2/models/<model>[/versions/<v>]/infer, before its route: with the model's
-- capture on, draw this request (fraction); a drawn request's body is read into memory now (nginx passes
-- the others on as they stream in), and $modelyard_capture marks it for the log phase. The variable, unlike
-- ngx.ctx, survives the jump to the mirrored location.
function M.draw(model)
    local cfg = model and current(model)
    if not cfg or cfg.fraction <= 0 or math.random() >= cfg.fraction then
        return
    end
    ngx.var.modelyard_capture = "1"
    ngx.req.read_body()
end

-- log_by_lua of the same locations: append a request draw() marked to the model's capture, once its answer
-- went to the client, and only when that answer was 2xx. `named` is the version the URI named, if any;
-- otherwise the version the route sent it to ($modelyard_version).
function M.log(model, named)
    if ngx.var.modelyard_capture ~= "1" then
        return
    end
    local cfg = current(model)
    if not cfg or ngx.status < 200 or ngx.status >= 300 then
        return
    end
    local version = tonumber(named) or tonumber(ngx.var.modelyard_version)
    local body = ngx.req.get_body_data()  -- nil when the body went to a temporary file (too large)
    if not body or not version then
        return skip(model)
    end
    local length = ngx.var.http_inference_header_content_length
    local line = cjson.encode({
        id = ngx.var.request_id, time = ngx.now(), model = model, version = version,
        content_type = ngx.var.content_type or cjson.null,
        header_length = tonumber(length) or cjson.null,
        body = ngx.encode_base64(body),
    }) .. "\n"
    local key = "bytes:" .. model
    local used = store:incr(key, #line, 0)
    if not used or used > cfg.max_bytes then
        store:incr(key, -#line, 0)
        return skip(model)
    end
    local file = file_of(model)
    if not file then
        store:incr(key, -#line, 0)
        return skip(model)
    end
    file:write(line)
    file:flush()
end

local function report()
    local out = {}
    for _, key in ipairs(store:get_keys(0)) do
        local model = key:match("^cfg:(.+)$")
        if model then
            local cfg = cjson.decode(store:get(key))
            cfg.bytes = store:get("bytes:" .. model) or 0
            cfg.skipped = store:get("skipped:" .. model) or 0
            out[model] = cfg
        end
    end
    return out
end

-- content_by_lua of the control socket's /capture: GET answers each model's settings with its counters,
-- POST replaces the settings, PUT {model: bytes} sets the bytes each model's directory holds now (the agent
-- measures them after deleting expired files) and makes every worker reopen its files.
function M.control()
    local method = ngx.req.get_method()
    if method == "POST" or method == "PUT" then
        local body = require("modelyard_routes").request_json()
        if method == "POST" then
            local count, err = M.apply(body)
            if not count then
                ngx.status = 400
                ngx.say(err)
                return
            end
        else
            if type(body) ~= "table" then
                ngx.status = 400
                ngx.say("capture usage must be a JSON object of model names and bytes")
                return
            end
            for model, bytes in pairs(body) do
                if type(model) ~= "string" or type(bytes) ~= "number" or bytes < 0 then
                    ngx.status = 400
                    ngx.say("the usage of " .. tostring(model) .. " must be a number of bytes")
                    return
                end
            end
            for model, bytes in pairs(body) do
                store:set("bytes:" .. model, bytes)
            end
            store:incr(GENERATION, 1, 0)
        end
    end
    local out = report()
    ngx.header["Content-Type"] = "application/json"
    ngx.say(next(out) and cjson.encode(out) or "{}")
end

return M
