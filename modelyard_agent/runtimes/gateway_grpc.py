"""The gRPC server of a Triton host's gateway (``runtimes.gateway``): Triton's client methods passed to its gRPC
endpoint, the rest refused, and inference calls that name an on-demand model in ``x-modelyard-model`` held and
counted (``modelyard_gateway.lua``'s ``grpc``); on a host with a model that requires an inference key, calls naming
a model are checked against its keys first (``modelyard_keys.lua``'s ``check_grpc``)."""

# The client methods of Triton's gRPC service (grpc_service.proto of triton-inference-server/common); the
# others (RepositoryIndex, RepositoryModelLoad/Unload, *SharedMemory*, TraceSetting, LogSettings) are the agent's.
GRPC_CLIENT_METHODS = ("ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer",
                       "ModelStreamInfer", "ModelConfig", "ModelStatistics")

# A gRPC refusal is a "trailers-only" answer: HTTP 200 whose headers carry grpc-status, no body (the gRPC
# over HTTP/2 protocol, PROTOCOL-HTTP2.md of grpc/grpc); nginx sends it as a header-only 204.
_SERVER = """\
    upstream modelyard_triton_grpc {{
        server {triton_grpc} max_fails=0;
        keepalive 64;
    }}
    server {{
        listen {grpc_listen} http2 backlog=4096;
        grpc_read_timeout 300s;
        grpc_send_timeout 300s;
        location ~ ^/(inference\\.GRPCInferenceService/({methods})|grpc\\.health\\.v1\\.Health/(Check|Watch))$ {{
            set $modelyard_counted "";
            lua_check_client_abort on;
            # An inference call that names its model in the metadata header x-modelyard-model is held while an
            # on-demand model is not resident, and counted in flight on it (modelyard_gateway.lua's grpc).
            # A call naming a model that requires an inference key is checked first (modelyard_keys.lua's check_grpc).
            rewrite_by_lua_block {{
                require("modelyard_keys").check_grpc()
                require("modelyard_gateway").grpc(ngx.var.http_x_modelyard_model)
            }}
            log_by_lua_block {{ require("modelyard_routes").release(ngx.var.modelyard_counted) }}
            grpc_pass grpc://modelyard_triton_grpc;
        }}
        location / {{
            default_type application/grpc;
            add_header grpc-status 7 always;
            add_header grpc-message "not a client method: the gateway passes health, metadata and inference" always;
            return 204;
        }}
    }}
"""


def grpc_server(triton_grpc: str, grpc_listen: str) -> str:
    """The nginx ``upstream`` and ``server`` blocks that take gRPC at ``grpc_listen`` (``[host:]port``) for
    Triton's gRPC endpoint at ``triton_grpc`` (``host:port``)."""
    return _SERVER.format(triton_grpc=triton_grpc, grpc_listen=grpc_listen, methods="|".join(GRPC_CLIENT_METHODS))
