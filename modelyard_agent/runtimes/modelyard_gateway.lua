-- Routing of a Triton host's gateway (modelyard_agent/runtimes/gateway.py writes the nginx config that
-- loads this module). The routes, their store in the shared dict "modelyard_routes", routes.json, the
-- control socket and the sticky pick are modelyard_routes.lua's, shared with the BentoML front.
local routes = require("modelyard_routes")

local M = {}

-- rewrite_by_lua for /v2/models/<model>/infer: a request that names no version goes to the version its
-- model's route picks, under /v2/models/<model>/versions/<v>/infer. Models without a route pass as sent.
function M.route(model)
    local route = routes.current(model)
    if not route then
        return
    end
    local version = routes.pick(route)
    ngx.var.modelyard_version = version
    ngx.req.set_uri("/v2/models/" .. model .. "/versions/" .. string.format("%d", version) .. "/infer")
    -- A share of the requests is mirrored to the shadow (never the ones that went to that version itself):
    -- those continue in a location with nginx's mirror, the others in one without.
    if routes.takes_shadow(route, version) then
        ngx.var.modelyard_shadow = string.format("%d", route.shadow)
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

return M
