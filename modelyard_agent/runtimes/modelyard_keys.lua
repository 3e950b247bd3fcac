-- Inference keys at a host's front: the Triton gateway (modelyard_agent/runtimes/gateway.py) and the BentoML
-- front (nginx.py, through modelyard_bento.lua) load this module.
-- Phases: rewrite (check, before anything reads the body or routes the request); content of the control socket
-- (control: GET, POST and PATCH /keys).
--
-- A model that requires a key has an entry in the shared dict "modelyard_keys" under its name, and one entry per
-- key that opens it under "<model>\0<SHA-256 of the key>" (the digest the control plane stores, sent in hex:
-- the key itself never reaches a host). The keys come from <dir>/keys.json when nginx starts and from the control
-- socket afterwards (PATCH /keys with the models that changed, {model: [digest, ...] or null: no key required};
-- POST /keys with every model's), so a revoked key stops opening its model at the next push, with no reload.
--
-- A request to such a model must carry "Authorization: Bearer <key>": none answers 401, a key that opens no model
-- here (wrong, revoked, expired or another model's) 403, both JSON with a "code". The check hashes the presented
-- key (SHA-256, OpenSSL through LuaJIT's FFI) and looks the digest up: nothing is compared with a secret byte by
-- byte, so the time an answer takes says nothing of how much of a guess was right (a lookup's timing depends on a
-- digest of the guess, which tells nothing of any key's digest). The header is then removed, so neither Triton nor
-- a BentoML process, a shadow copy nor a capture ever holds it.
--
-- A refused key is sent through @modelyard_bad_key, whose limit_req (keyed on the client's address, in the
-- gateway's config) answers a client that keeps guessing 429 with Retry-After.
local ffi = require("ffi")
local cjson = require("cjson.safe")
local routes = require("modelyard_routes")

ffi.cdef([[unsigned char *SHA256(const unsigned char *d, size_t n, unsigned char *md);]])

local M = {}
local keys = ngx.shared.modelyard_keys
local REQUIRED = "required"
local digest_buffer = ffi.new("unsigned char[32]")

-- Refusals by reason since nginx started ("missing", "wrong"): two counters, never a label from the request.
M.REASONS = { "missing", "wrong" }

-- The SHA-256 of `text`, 32 bytes.
local function sha256(text)
    ffi.C.SHA256(text, #text, digest_buffer)
    return ffi.string(digest_buffer, 32)
end

-- A digest's entry: "<model>\0<32 bytes>" (model names hold no NUL, so no entry is a prefix of another's).
local function entry(model, digest)
    return model .. "\0" .. digest
end

local function from_hex(hex)
    return (hex:gsub("%x%x", function(pair)
        return string.char(tonumber(pair, 16))
    end))
end

local function to_hex(bytes)
    return (bytes:gsub(".", function(char)
        return string.format("%02x", char:byte())
    end))
end

-- The model and hex digest of a digest's entry, or nil for another entry.
local function parse(key)
    if #key > 33 and key:byte(-33) == 0 then
        return key:sub(1, -34), to_hex(key:sub(-32))
    end
end

local function digest_list(value, model)
    if type(value) ~= "table" or model == "" or model:find("[%z/]") then
        return false
    end
    for _, digest in ipairs(value) do
        if type(digest) ~= "string" or not digest:match("^" .. string.rep("%x", 64) .. "$") then
            return false
        end
    end
    return #value == 0 or next(value, #value) == nil
end

-- Set the keys of `table` ({model: [digest, ...]}, or null when `removable`: no key required); nil and why when
-- one is malformed (then nothing is set) or finds no room. `before` runs once the table is found well formed.
local function store(table, removable, before)
    return routes.store_table(table, removable, digest_list, { "keys", "the keys", "a list of hex SHA-256 digests" },
        before, function(model, digests)
            -- A model's old digests go first: the agent always sends all of a model's keys.
            for _, old in ipairs(keys:get_keys(0)) do
                if parse(old) == model then
                    keys:delete(old)
                end
            end
            keys:delete(model)
            if digests == cjson.null then
                return true
            end
            for _, digest in ipairs(digests) do
                local ok, err = keys:safe_set(entry(model, from_hex(digest)), true)
                if not ok then
                    return nil, err
                end
            end
            return keys:safe_set(model, REQUIRED)
        end)
end

-- Whether any model here requires a key ("\0any", kept after each change): the gRPC check reads nothing else
-- on a host without keyed models.
local ANY = "\0any"

local function mark_any(count, err)
    local any = false
    for _, key in ipairs(keys:get_keys(0)) do
        if keys:get(key) == REQUIRED then
            any = true
            break
        end
    end
    keys:set(ANY, any)
    return count, err
end

-- Replace every model's keys with those of `table`.
function M.apply(table)
    return mark_any(store(table, false, function()
        keys:flush_all()
    end))
end

-- Change the keys of the models `table` names, leaving the others.
function M.patch(table)
    return mark_any(store(table, true, function() end))
end

-- init_by_lua: the keys the agent last wrote.
function M.load(path)
    routes.load_file(path, M.apply, "inference keys")
end

local function refuse(status, code, message)
    ngx.status = status
    ngx.header["Content-Type"] = "application/json"
    if status == 401 then
        ngx.header["WWW-Authenticate"] = 'Bearer realm="modelyard"'
    end
    ngx.say(cjson.encode({ error = message, code = code }))
    return ngx.exit(ngx.HTTP_OK)
end

-- Whether the Authorization header `header` carries a key that opens `model`: "missing" (no bearer key), "wrong"
-- (one whose digest is not the model's), or nil when it opens it; counted by reason.
local function refusal(model, header)
    local presented = header and header:match("^%s*[Bb][Ee][Aa][Rr][Ee][Rr]%s+(%S+)%s*$")
    if not presented then
        keys:incr("\0refused missing", 1, 0)
        return "missing"
    end
    if not keys:get(entry(model, sha256(presented))) then
        keys:incr("\0refused wrong", 1, 0)
        return "wrong"
    end
end

-- rewrite_by_lua of every client request to `model`: nothing for a model that requires no key; else 401 without
-- a bearer key, 403 (through @modelyard_bad_key, 429 past its rate) with one that does not open the model.
-- A request that passes goes on without its Authorization header.
function M.check(model)
    if not keys:get(model) then
        return
    end
    local refused = refusal(model, ngx.var.http_authorization)
    if refused == "missing" then
        return refuse(401, "inference_key_missing",
            "this model requires an inference key: send Authorization: Bearer <key>")
    end
    if refused then
        ngx.req.clear_header("Authorization")
        return ngx.exec("@modelyard_bad_key")
    end
    ngx.req.clear_header("Authorization")
end

-- The varint at `pos` of `data` and the position after it, or nil past the end.
local function varint(data, pos)
    local value, scale = 0, 1
    while pos <= #data do
        local byte = data:byte(pos)
        value = value + (byte % 128) * scale
        pos = pos + 1
        if byte < 128 then
            return value, pos
        end
        scale = scale * 128
    end
end

-- The string field 1 (the model's name in ModelInferRequest, ModelMetadataRequest, ModelReadyRequest,
-- ModelConfigRequest and ModelStatisticsRequest) of the first gRPC message in `data`: "" when the message has none
-- (proto3's default), nil when it cannot be read (compressed, cut short, malformed).
function M.grpc_model_name(data)
    if #data < 5 or data:byte(1) ~= 0 then
        return nil
    end
    local size = ((data:byte(2) * 256 + data:byte(3)) * 256 + data:byte(4)) * 256 + data:byte(5)
    local pos, stop = 6, math.min(#data, 5 + size)
    while pos <= stop do
        local tag
        tag, pos = varint(data, pos)
        if not tag then
            return nil
        end
        local field, wire = math.floor(tag / 8), tag % 8
        if wire == 2 then
            local length
            length, pos = varint(data, pos)
            if not length or pos + length - 1 > stop then
                return nil
            end
            if field == 1 then
                return data:sub(pos, pos + length - 1)
            end
            pos = pos + length
        elseif wire == 0 then
            local _
            _, pos = varint(data, pos)
            if not pos then
                return nil
            end
        elseif wire == 1 or wire == 5 then
            pos = pos + (wire == 1 and 8 or 4)
        else
            return nil
        end
    end
    return pos == stop + 1 and "" or nil
end

local function grpc_refuse(status, message)
    ngx.status = 204  -- a trailers-only gRPC answer, as the gateway's refusal of other methods (gateway_grpc.py)
    ngx.header["Content-Type"] = "application/grpc"
    ngx.header["grpc-status"] = status
    ngx.header["grpc-message"] = message
    ngx.send_headers()
    return ngx.exit(ngx.HTTP_OK)
end

-- The first bytes of the request body (read whole by nginx, in memory or in its temporary file), or nil.
local function body_start()
    ngx.req.read_body()
    local data = ngx.req.get_body_data()
    if data then
        return data
    end
    local path = ngx.req.get_body_file()
    local file = path and io.open(path, "rb")
    if file then
        data = file:read(65536)
        file:close()
    end
    return data
end

-- rewrite_by_lua of a gRPC call through the gateway, on a host where some model requires a key: a call that names
-- a model (ModelInfer, ModelMetadata, ModelReady, ModelConfig, ModelStatistics) is checked against the model its
-- message names, with the metadata "authorization: Bearer <key>": none answers UNAUTHENTICATED (16), a wrong key
-- PERMISSION_DENIED (7). ModelStreamInfer is refused there (its messages come while it runs, after the check),
-- and so is ModelStatistics without a name (every model's). Server-level calls pass. The metadata is removed
-- before Triton.
function M.check_grpc()
    if not keys:get(ANY) then
        return
    end
    local method = ngx.var.uri:match("^/inference%.GRPCInferenceService/(Model%a+)$")
    if not method then
        return
    end
    if method == "ModelStreamInfer" then
        return grpc_refuse(7, "streaming inference cannot be checked for inference keys on this host: use ModelInfer")
    end
    local model = M.grpc_model_name(body_start() or "")
    if model == nil or (model == "" and method == "ModelStatistics") then
        return grpc_refuse(7, "name one model in the request (uncompressed): this host checks inference keys")
    end
    if not keys:get(model) then
        return
    end
    local refused = refusal(model, ngx.var.http_authorization)
    if refused == "missing" then
        return grpc_refuse(16, "this model requires an inference key: send the metadata authorization: Bearer <key>")
    elseif refused then
        return grpc_refuse(7, "this inference key does not open this model (wrong, revoked or expired)")
    end
    ngx.req.clear_header("Authorization")
end

-- The 403 of a key that opens no model here (content of @modelyard_bad_key, past its limit_req).
function M.refuse_wrong()
    return refuse(403, "inference_key_refused", "this inference key does not open this model (wrong, revoked or expired)")
end

-- The refusals since nginx started, {missing = n, wrong = n}.
function M.refusals()
    local counts = {}
    for _, reason in ipairs(M.REASONS) do
        counts[reason] = keys:get("\0refused " .. reason) or 0
    end
    return counts
end

-- The /metrics lines of the refusals: modelyard_gateway_inference_key_refusals_total{reason} (missing, wrong),
-- two series whatever the clients send.
function M.exposition()
    if not keys then
        return {}
    end
    local counts = M.refusals()
    local out = {
        "# HELP modelyard_gateway_inference_key_refusals_total Requests to models that require an inference key"
            .. " refused, by reason: missing (401) or wrong (403, or 429 past the rate of wrong keys).",
        "# TYPE modelyard_gateway_inference_key_refusals_total counter",
    }
    for _, reason in ipairs(M.REASONS) do
        out[#out + 1] = string.format('modelyard_gateway_inference_key_refusals_total{reason="%s"} %d', reason,
            counts[reason])
    end
    return out
end

-- The keys held, {model: [digest, ...]} (only the models `named` names, when given).
local function held(named)
    local models = {}
    for _, key in ipairs(keys:get_keys(0)) do
        local model, digest = parse(key)
        if model and (not named or named[model] ~= nil) then
            models[model] = models[model] or {}
            table.insert(models[model], digest)
        elseif not named and keys:get(key) == REQUIRED then
            models[key] = models[key] or {}
        end
    end
    for model in pairs(named or {}) do
        if keys:get(model) then
            models[model] = models[model] or {}
        end
    end
    for _, digests in pairs(models) do
        table.sort(digests)
    end
    return models
end

-- content_by_lua of the control socket's /keys: GET answers {model: [digest, ...]}, POST replaces them all, PATCH
-- changes the models it names ({model: [digest, ...] or null}) and answers with those alone; GET /keys/refusals
-- answers the refusals by reason.
function M.control()
    if ngx.var.uri == "/keys/refusals" then
        ngx.header["Content-Type"] = "application/json"
        return ngx.say(cjson.encode(M.refusals()))
    end
    local named = routes.patch_from_request(M.patch)
    if not (named and routes.replace_from_request(M.apply)) then
        return
    end
    local models = held(named ~= true and named or nil)
    local parts = {}
    for model, digests in pairs(models) do
        parts[#parts + 1] = cjson.encode(model) .. ": " .. (#digests > 0 and cjson.encode(digests) or "[]")
    end
    ngx.header["Content-Type"] = "application/json"
    ngx.say("{" .. table.concat(parts, ", ") .. "}")
end

return M
