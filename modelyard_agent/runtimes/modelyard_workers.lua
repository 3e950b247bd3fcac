-- What an nginx worker that died leaves behind in the shared dicts, given back by the next worker that starts.
--
-- A request counts itself in a shared dict (in flight on a version, held for a cold model) and uncounts itself in
-- its log phase or its ngx.on_abort handler. A worker killed by a signal or a crash runs neither, so its counts
-- would stay forever: a model's queue of held requests would look full, and the in-flight counters of workers
-- long gone would fill their dict. Such counts are kept per worker, under keys that end with the worker's pid; nginx's master
-- starts a new worker for each one that died, and every worker, when it starts (init_worker_by_lua), gives back
-- the counts of workers that no longer run. A worker that a reload retires still runs while it finishes its
-- requests, so its counts stay until its own log phases take them back.
local ffi = require("ffi")

local M = {}

pcall(ffi.cdef, "int kill(int pid, int sig);")
local ESRCH = 3  -- kill(2): no such process

-- Whether process `pid` runs (kill(pid, 0): no signal is sent, only the check; EPERM means it runs as another
-- user, which is still running).
function M.alive(pid)
    if ffi.C.kill(pid, 0) == 0 then
        return true
    end
    return ffi.errno() ~= ESRCH
end

-- The keys of `dict` that `pattern` matches and whose pid (the pattern's last capture) names a worker that no
-- longer runs, each with the pattern's first capture: a list of {key, name}.
local function keys_of_dead_workers(dict, pattern)
    local found, alive, own = {}, {}, ngx.worker.pid()
    for _, key in ipairs(dict:get_keys(0)) do
        local captures = { key:match(pattern) }
        local pid = tonumber(captures[#captures])
        if pid and pid ~= own then
            if alive[pid] == nil then
                alive[pid] = M.alive(pid)
            end
            if not alive[pid] then
                found[#found + 1] = { key, captures[1] }
            end
        end
    end
    return found
end

-- Delete every key of `dict` that `pattern` matches and whose pid (its last capture) names a worker that no
-- longer runs: counts kept per worker and read as a sum (modelyard_routes.lua's requests in flight).
function M.forget(dict, pattern)
    for _, found in ipairs(dict and keys_of_dead_workers(dict, pattern) or {}) do
        dict:delete(found[1])
    end
end

-- Give back the counts of workers that no longer run where a per-worker key mirrors a total: for each key of
-- `dict` that `pattern` matches (captures: a name, then the pid) of a dead worker, its count is taken off the
-- total `total_prefix .. name` and the key deleted. Workers that start together may reap the same key: the
-- one whose decrement takes the key to 0 takes the count off the total; another sees it below 0 and undoes its
-- own, so each count comes off once.
function M.give_back(dict, pattern, total_prefix)
    for _, found in ipairs(dict and keys_of_dead_workers(dict, pattern) or {}) do
        local key, name = found[1], found[2]
        local count = dict:get(key)
        if type(count) == "number" and count > 0 then
            local after = dict:incr(key, -count)
            if after == 0 then
                dict:incr(total_prefix .. name, -count, 0)
            elseif after then
                dict:incr(key, count)
            end
        end
        if (dict:get(key) or 0) <= 0 then
            dict:delete(key)
        end
    end
end

return M
