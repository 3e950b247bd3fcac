-- The split of a BentoML host's front (modelyard_agent/runtimes/nginx.py writes the config that loads it):
-- a model whose location is split serves each request from the `bentoml serve` process of the version
-- its route (modelyard_routes.lua) picks, through the one upstream "modelyard_split" whose balancer sends
-- it to that version's port. Ports come with the route, so starting a canary, changing its percent,
-- promoting or rolling it back needs no reload.
--
-- In-flight requests are counted per version (modelyard_routes.lua's claim; a shadow copy counts for the
-- shadow's version until the request it copies ends), so the agent stops a version once nothing is on its
-- way to it.
local routes = require("modelyard_routes")
local metrics = require("modelyard_metrics")
local balancer = require("ngx.balancer")

local M = {}
local VERSION_REQUEST = "http_x_modelyard_version_request"

local function port_of(route, version)
    local ports = route.ports
    return type(ports) == "table" and ports[string.format("%d", version)] or nil
end

local function serves(route, version)
    return (version == route.stable or version == route.canary) and port_of(route, version) ~= nil
end

local function refuse(status, ...)
    ngx.status = status
    ngx.header["Content-Type"] = "text/plain"
    ngx.say(...)
    return ngx.exit(status)
end

-- rewrite_by_lua of location /<model>/: pick the version (the one X-Modelyard-Version-Request names, or the
-- route's pick), strip the /<model> prefix and leave the port for balance().
function M.route(model)
    metrics.start()
    local asked = ngx.var[VERSION_REQUEST]
    local pinned = asked and asked ~= "" and tonumber(asked) or nil
    if asked and asked ~= "" and not (pinned and pinned >= 1 and pinned % 1 == 0) then
        return refuse(400, "X-Modelyard-Version-Request must be a version number, got ", asked)
    end
    local route, version, key = routes.claim(model, function(route)
        if pinned then
            return serves(route, pinned) and pinned or nil
        end
        return routes.pick(route)
    end)
    if not route then
        return refuse(503, "no route for ", model, " on this host")
    end
    if not version then
        local served = { route.stable }
        if type(route.canary) == "number" then
            served[2] = route.canary
        end
        return refuse(404, model, " version ", asked, " is not served on this host (served: ",
            table.concat(served, ", "), ")")
    end
    ngx.ctx.modelyard_port = port_of(route, version)
    ngx.ctx.modelyard_counted = key
    ngx.ctx.modelyard_role = pinned and "pinned" or (version == route.canary and "canary" or "stable")
    ngx.var.modelyard_version = version
    local path = string.sub(ngx.var.uri, #model + 2)
    ngx.var.modelyard_path = path
    ngx.req.set_uri(path)
end

-- rewrite_by_lua of the mirror subrequest every request to a split /<model>/ makes: when the route has a
-- shadow and this request is drawn (shadow_percent), a copy goes to the shadow's process; nginx discards
-- its answer, so a client never sees it. Otherwise the subrequest ends here (204, no upstream).
function M.shadow(model)
    local served = tonumber(ngx.var.modelyard_version)
    local route, version, key = routes.claim(model, function(route)
        if served and routes.takes_shadow(route, served) and port_of(route, route.shadow) then
            return route.shadow
        end
        return nil
    end)
    if not version then
        return ngx.exit(204)
    end
    ngx.ctx.modelyard_port = port_of(route, version)
    metrics.start_shadow(version)
    ngx.var.modelyard_shadow = key
    ngx.req.set_uri(ngx.var.modelyard_path)
end

-- rewrite_by_lua of /_metrics/<model>/<version> for a split model: that version's /metrics while the route
-- serves it, else 404.
function M.metrics(model, version)
    local route = routes.current(model)
    local wanted = tonumber(version)
    if not route or not wanted or not serves(route, wanted) then
        return refuse(404, "no version ", version, " of ", model, " is served here")
    end
    ngx.ctx.modelyard_port = port_of(route, wanted)
    ngx.req.set_uri("/metrics")
end

-- balancer_by_lua of upstream modelyard_split: the port route(), shadow() or metrics() chose.
function M.balance()
    local ok, err = balancer.set_current_peer("127.0.0.1", ngx.ctx.modelyard_port)
    if not ok then
        ngx.log(ngx.ERR, "no peer for this request: ", err)
        return ngx.exit(502)
    end
end

-- log_by_lua of location /<model>/: the request (and its shadow copy) no longer counts in flight, and its
-- answer counts under its version and role (modelyard_metrics.lua); one refused before it was given a version
-- counts under version "" and role "refused".
function M.done(model)
    routes.release(ngx.ctx.modelyard_counted)
    routes.release(ngx.var.modelyard_shadow)
    if model then
        metrics.observe(model, ngx.var.modelyard_version, ngx.ctx.modelyard_role or "refused")
    end
end

-- rewrite_by_lua and log_by_lua of a plain location /<model>/, the one version `version` serves: "pinned"
-- when the request named it (X-Modelyard-Version-Request), "stable" when it named none, and "refused" (version
-- "") when it named another, which the location answered 404.
function M.plain_start()
    metrics.start()
end

function M.plain_done(model, version)
    local asked = ngx.var[VERSION_REQUEST]
    if not asked or asked == "" then
        metrics.observe(model, version, "stable")
    elseif asked == version then
        metrics.observe(model, version, "pinned")
    else
        metrics.observe(model, "", "refused")
    end
end

-- GET /inflight, where a front started from an earlier agent's config still calls it here (until its reload).
M.counts = routes.counts

return M
