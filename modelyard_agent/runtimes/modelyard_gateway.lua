-- Routing of a Triton host's gateway (modelyard_agent/runtimes/gateway.py writes the nginx config that
-- loads this module). The routes, their store in the shared dict "modelyard_routes", routes.json, the
-- control socket, the sticky pick and the in-flight counts are modelyard_routes.lua's, shared with the
-- BentoML front.
local routes = require("modelyard_routes")
local metrics = require("modelyard_metrics")
local residency = require("modelyard_residency")

local M = {}

-- rewrite_by_lua for /v2/models/<model>/infer: a request that names no version goes to the version its
-- model's route picks, under /v2/models/<model>/versions/<v>/infer, and counts in flight on that version
-- until done(). Models without a route pass as sent. The request's role ($modelyard_role: stable, canary or
-- unrouted) is what done() counts it under (modelyard_metrics.lua). A request for an on-demand model that is
-- not resident is held first until it is (modelyard_residency.lua), and counted in flight before it reads
-- the model's state again, so that an eviction either waits for it or holds it.
function M.route(model)
    local route, version, key = M.claim_resident(model, routes.pick)
    if key then
        ngx.var.modelyard_counted = key
    end
    if not route then
        ngx.var.modelyard_role = "unrouted"
        -- answered() reads the version from Triton's answer, asked for without compression
        ngx.ctx.modelyard_unrouted = true
        ngx.var.modelyard_accept_encoding = ""
        return
    end
    ngx.var.modelyard_version = version
    ngx.var.modelyard_role = version == route.canary and "canary" or "stable"
    ngx.req.set_uri("/v2/models/" .. model .. "/versions/" .. string.format("%d", version) .. "/infer")
    -- A share of the requests is mirrored to the shadow (never the ones that went to that version itself):
    -- those continue in a location with nginx's mirror, the others in one without.
    if routes.takes_shadow(route, version) then
        ngx.var.modelyard_shadow = string.format("%d", route.shadow)
        -- ngx.exec drops ngx.ctx, where the request's clock started; variables survive it.
        ngx.var.modelyard_started = ngx.ctx.modelyard_started
        return ngx.exec("@modelyard_mirrored")
    end
end

-- rewrite_by_lua of the mirror subrequest of a request route() drew for its model's shadow: the copy goes to
-- /v2/models/<model>/versions/<shadow>/infer, counted in flight on the shadow until the request it copies
-- ends; nginx discards the answer, so a client never sees it. When the route no longer has that shadow, no
-- copy is made. The copy is measured as the shadow's (modelyard_metrics.lua's start_shadow and shadow_done).
function M.shadow()
    local model, drawn = ngx.var.modelyard_model, tonumber(ngx.var.modelyard_shadow)
    if not model or not drawn then
        return ngx.exit(204)
    end
    local _, version, key = routes.claim(model, function(route)
        return route.shadow == drawn and drawn or nil
    end)
    if not version then
        return ngx.exit(204)
    end
    -- The mirror subrequest shares its request's variables, so the request's log phase sees this key.
    if key then
        ngx.var.modelyard_shadow_counted = key
    end
    metrics.start_shadow(version)
    ngx.req.set_uri("/v2/models/" .. model .. "/versions/" .. string.format("%d", version) .. "/infer")
end

-- log_by_lua of a request that named no version: it (and its shadow copy) no longer counts in flight, and its
-- answer counts under its version and role; one refused before it was routed (a body over its model's
-- limit) counts under version "" and role "refused". With `measure` false nothing is counted.
function M.done(model, measure)
    routes.release(ngx.var.modelyard_counted)
    routes.release(ngx.var.modelyard_shadow_counted)
    if measure == false then
        return
    end
    local role, version = ngx.var.modelyard_role, ngx.var.modelyard_version
    if role == "unrouted" then
        -- Triton answered with the version it picked (its newest ready one): that version's answer to a
        -- request that named none, as a routed one's "stable"; an answer that names none counts as unrouted.
        version = ngx.ctx.modelyard_answered or ""  -- false: the answer named no version
        role = version ~= "" and "stable" or "unrouted"
    end
    model, version, role = M.known(model, version, role ~= "" and role or "refused")
    metrics.observe(model, version, role, tonumber(ngx.var.modelyard_started))
end

-- body_filter_by_lua of a request that named no version: metrics.classify() (a 500 refusing a malformed body
-- counts as a 4xx) and, for a model without a route, the "model_version" its answer's JSON starts with
-- (KServe v2; a binary answer's JSON header too), read from its first non-empty chunk only.
function M.answered()
    metrics.classify()
    local ctx = ngx.ctx
    if not ctx.modelyard_unrouted or ctx.modelyard_answered ~= nil then
        return
    end
    local chunk = ngx.arg[1]
    if type(chunk) == "string" and chunk ~= "" then
        ctx.modelyard_answered = chunk:match('"model_version"%s*:%s*"(%d+)"') or false
    elseif ngx.arg[2] then
        ctx.modelyard_answered = false
    end
end

-- `routes.claim(model, choose)` once `model` is resident (held until then; at once for a model that is
-- always resident), counted in flight while it still is: an on-demand model's request that no route counts
-- on a version is counted on the model alone (routes.claim_model).
function M.claim_resident(model, choose)
    ngx.update_time()
    local started = ngx.now()  -- one deadline for every hold of this request: its cold_start_timeout is a bound
    while true do
        residency.hold(model, started)
        local route, version, key = routes.claim(model, choose)
        if not key and residency.settings(model) then
            key = routes.claim_model(model)
        end
        if residency.still_resident(model) then
            return route, version, key
        end
        routes.release(key)
    end
end

-- rewrite_by_lua of a request that named its version: for an on-demand model, held until the model is
-- resident and counted in flight on that version until pinned_done(); other models pass untouched.
function M.named(model, version)
    if not residency.settings(model) then
        return
    end
    -- Counted on the version when the model's route gives it (a drain of that version waits for it), else on
    -- the model alone: a version taken from the client's digits would add a counter per number sent.
    local _, _, key = M.claim_resident(model, function(route)
        local named = tonumber(version)
        if named == route.stable or named == route.canary or named == route.shadow then
            return named
        end
    end)
    ngx.var.modelyard_counted = key or ""
end

-- rewrite_by_lua of a gRPC call through the gateway. gRPC carries its model inside the protobuf body, where
-- nginx does not look, so a client of an on-demand model names it in the metadata header x-modelyard-model: an
-- inference call (ModelInfer, ModelStreamInfer) that does is held like an HTTP request while the model is not
-- resident (a refusal is HTTP 503, which gRPC clients read as UNAVAILABLE) and counted in flight on the model
-- alone until its log phase, so no eviction cuts it. Other calls, and calls without the header, pass as sent.
function M.grpc(model)
    if not model or model == "" or not residency.settings(model) then
        return
    end
    local uri = ngx.var.uri
    if not (uri:sub(-11) == "/ModelInfer" or uri:sub(-17) == "/ModelStreamInfer") then
        return
    end
    local _, _, key = M.claim_resident(model, function()
        return nil
    end)
    ngx.var.modelyard_counted = key or ""
end

-- log_by_lua of a request that named its version: no longer in flight; counted as "pinned" (a 404 as M.known
-- says) unless `measure` is false.
function M.pinned_done(model, version, measure)
    routes.release(ngx.var.modelyard_counted)
    if measure == false then
        return
    end
    if not ngx.var.upstream_addr then
        -- Answered by the gateway itself (held past its timeout, no loader, a client gone, a body too large):
        -- Triton never vouched for the version the client named, so it counts under none.
        version = ""
    end
    metrics.observe(M.known(model, version, version == "" and "refused" or "pinned"))
end

-- What an answer counts under, so that clients cannot add series at will: a 404 (an unknown model or version)
-- counts under version "" and role "refused", and under model "" too when the model has no route here.
function M.known(model, version, role)
    if ngx.status ~= 404 then
        return model, version, role
    end
    return routes.current(model) and model or "", "", "refused"
end

return M
