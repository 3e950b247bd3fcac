-- Routing of a Triton host's gateway (modelyard_agent/runtimes/gateway.py writes the nginx config that
-- loads this module). The routes, their store in the shared dict "modelyard_routes", routes.json, the
-- control socket, the sticky pick and the in-flight counts are modelyard_routes.lua's, shared with the
-- BentoML front.
local routes = require("modelyard_routes")
local metrics = require("modelyard_metrics")

local M = {}

-- rewrite_by_lua for /v2/models/<model>/infer: a request that names no version goes to the version its
-- model's route picks, under /v2/models/<model>/versions/<v>/infer, and counts in flight on that version
-- until done(). Models without a route pass as sent. The request's role ($modelyard_role: stable, canary or
-- unrouted) is what done() counts it under (modelyard_metrics.lua).
function M.route(model)
    local route, version, key = routes.claim(model, routes.pick)
    if not route then
        ngx.var.modelyard_role = "unrouted"
        return
    end
    if key then
        ngx.var.modelyard_counted = key
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
    local role = ngx.var.modelyard_role
    metrics.observe(model, ngx.var.modelyard_version, role ~= "" and role or "refused",
        tonumber(ngx.var.modelyard_started))
end

return M
