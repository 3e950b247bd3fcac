-- Draining before a graceful reload (modelyard_agent/runtimes/nginx_process.py, NginxProcess.reload). A reload
-- makes the old workers close their idle kept-alive client connections at once; a client that sends its next
-- request on one at that moment loses it ("connection reset by peer"). nginx has no per-request switch for
-- keep-alive, but passing through a location with keepalive_timeout 0 turns it off for the request: while
-- the shared dict "modelyard_drain" says so, the server's rewrite phase sends every request through such a
-- location (nginx_process.py, DRAIN_SERVER) and on to its own, so each client that sends during the drain is
-- told to close and reconnects, and at the reload no busy connection sits idle.
local cjson = require("cjson.safe")

local M = {}
local drain = ngx.shared.modelyard_drain

-- set_by_lua of the client server ($modelyard_draining): "1" while draining, "" otherwise.
function M.flag()
    return drain:get("draining") and "1" or ""
end

-- content_by_lua of the control socket's /drain: POST {"draining": true, "expires": seconds} starts the drain
-- (it ends by itself after `expires`, if given, so a reload that never finishes cannot leave it on), POST
-- {"draining": false} ends it; GET and POST answer {"draining": bool, "clients": n}, n the client connections
-- open now other than this one, busy or idle, in every worker ($connections_active, ngx_http_stub_status_module):
-- with none, no kept-alive client is there to lose a request to the reload, and the drain can end at once.
function M.control()
    if ngx.req.get_method() == "POST" then
        local body = require("modelyard_routes").request_json()
        if type(body) ~= "table" or type(body.draining) ~= "boolean" then
            ngx.status = 400
            ngx.say('a drain is {"draining": true} or {"draining": false}')
            return
        end
        if body.draining then
            local expires = tonumber(body.expires) or 0
            drain:set("draining", true, expires > 0 and expires or 0)
        else
            drain:delete("draining")
        end
    end
    ngx.header["Content-Type"] = "application/json"
    local clients = (tonumber(ngx.var.connections_active) or 1) - 1
    ngx.say(cjson.encode({draining = drain:get("draining") == true, clients = clients}))
end

return M
